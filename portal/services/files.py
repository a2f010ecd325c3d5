"""Files of a running instance through the portal: list, download, upload — through its host's relay.

Three places, all under ``/root`` (``core.relay.FILE_ROOTS``): the data disk
``/root/autodl-tmp``, the user's shared storage, and ``/root`` itself (the
system disk: what "save as image" keeps). A path that leaves ``/root`` (``..``,
absolute elsewhere) is refused here naming the field; the relay refuses a
symbolic link that leads out of the path's root, and lists links as links.

The web tier never talks to Docker: each operation goes to the relay of the
node holding the container (``portal.services.relay``), and streams. A listing is read
line by line (the relay stops at its cap), a download flows from the relay to
the browser a chunk at a time, an upload flows from Django's temporary file to
the relay a chunk at a time. Each holds one of the user's session slots while
it runs. Both transfers are limited to ``FILE_TRANSFER_MAX_MB``.
"""

from __future__ import annotations

import json
import posixpath
import time

import requests
from django.conf import settings

from core.errors import Conflict, InvalidInput
from core.relay import FILE_ROOTS, HOME, Op, file_root
from core.relay_tls import relay_http
from portal.services.relay import CONNECT_S, IDLE_S, RENEW_S, SessionSlot, refusal, relay_target, unreachable

ROOTS = FILE_ROOTS
CHUNK = 1024 * 1024
ERROR_BYTES = 64 * 1024  # the most of a relay's error answer that is read


def safe_path(path: str, *, field: str = "path") -> str:
    """The normalized absolute path if it lies under /root; InvalidInput naming ``field`` otherwise."""
    if not path or "\x00" in path:
        raise InvalidInput("give a path under /root", field=field)
    normal = posixpath.normpath(path if path.startswith("/") else posixpath.join(ROOTS[0], path))
    if not (normal == HOME or normal.startswith(HOME + "/")):
        raise InvalidInput(f"{path!r} is outside /root", field=field)
    return normal


def listing(workload, path: str, *, user) -> tuple[list[dict], bool]:
    """(entries of the folder, folders first, and whether the relay cut the list at its cap)."""
    directory = safe_path(path)
    with SessionSlot(user.pk):
        url, headers, pin = relay_target(
            workload=workload, user=user, op=Op.LIST, root=file_root(directory), path=directory
        )
        entries, last = [], {}
        try:
            with relay_http(pin).get(url, headers=headers, stream=True, timeout=(CONNECT_S, IDLE_S)) as response:
                _check(response, 200)
                for line in response.iter_lines(chunk_size=CHUNK):
                    item = json.loads(line)
                    if "name" not in item:
                        last = item
                        break
                    kind = item["kind"]
                    entries.append(
                        {
                            "name": item["name"],
                            "path": posixpath.join(directory, item["name"]),
                            "dir": kind == "dir",
                            "link": kind == "link",
                            "size": item["size"] if kind == "file" else None,
                        }
                    )
        except requests.RequestException as exc:
            raise unreachable(exc) from exc
    if not last:
        raise Conflict("the listing was cut short; try again")
    if "error" in last:  # what the instance's find printed is not a listing
        raise InvalidInput(str(last["error"]), field="path")
    return sorted(entries, key=lambda e: (not e["dir"], e["name"])), bool(last.get("truncated"))


def download(workload, path: str, *, user):
    """(file name, size, iterable of byte chunks) of one regular file; close the iterable when done."""
    target = safe_path(path)
    slot = SessionSlot(user.pk).take()
    try:
        url, headers, pin = relay_target(
            workload=workload, user=user, op=Op.DOWNLOAD, root=file_root(target), path=target
        )
        try:
            response = relay_http(pin).get(url, headers=headers, stream=True, timeout=(CONNECT_S, IDLE_S))
        except requests.RequestException as exc:
            raise unreachable(exc) from exc
        try:
            _check(response, 200)
            size = int(response.headers["Content-Length"])
            if size > settings.FILE_TRANSFER_MAX_MB * 1024 * 1024:
                raise InvalidInput(f"download a file of at most {settings.FILE_TRANSFER_MAX_MB} MB", field="path")
        except BaseException:
            response.close()
            raise
    except BaseException:
        slot.release()
        raise
    return posixpath.basename(target), size, _Download(response, slot)


class _Download:
    """The relay's bytes, chunk by chunk; ``close()`` (Django calls it) ends the call and frees the slot."""

    def __init__(self, response: requests.Response, slot: SessionSlot):
        self.response, self.slot = response, slot

    def __iter__(self):
        renewed = time.monotonic()
        for chunk in self.response.iter_content(CHUNK):
            yield chunk
            if time.monotonic() - renewed > RENEW_S:
                self.slot.renew()
                renewed = time.monotonic()

    def close(self) -> None:
        self.response.close()
        self.slot.release()


def upload(workload, directory: str, name: str, source, *, user) -> str:
    """Put an uploaded file (``source``: a Django UploadedFile) into ``directory``; returns its path."""
    folder = safe_path(directory, field="dir")
    if not name or "/" in name or name in (".", ".."):
        raise InvalidInput("a plain file name, without folders", field="file")
    if source.size > settings.FILE_TRANSFER_MAX_MB * 1024 * 1024:
        raise InvalidInput(f"at most {settings.FILE_TRANSFER_MAX_MB} MB per file", field="file")
    with SessionSlot(user.pk) as slot:
        url, headers, pin = relay_target(
            workload=workload, user=user, op=Op.UPLOAD, root=file_root(folder), path=folder, name=name, size=source.size
        )
        try:
            response = relay_http(pin).put(
                url, data=_chunks(source, slot), headers=headers, timeout=(CONNECT_S, IDLE_S)
            )
        except requests.RequestException as exc:
            raise unreachable(exc) from exc
        with response:
            _check(response, 201)
    return posixpath.join(folder, name)


def _chunks(source, slot: SessionSlot):
    renewed = time.monotonic()
    source.seek(0)
    while chunk := source.read(CHUNK):
        yield chunk
        if time.monotonic() - renewed > RENEW_S:
            slot.renew()
            renewed = time.monotonic()


def _check(response: requests.Response, status: int) -> None:
    if response.status_code != status:
        raise refusal(response.status_code, response.raw.read(ERROR_BYTES, decode_content=True))
