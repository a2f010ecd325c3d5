"""Files of a running instance through the portal: list, download, upload — under /root.

Three places, all under ``/root``: ``/root/autodl-tmp`` (the instance's data
volume), ``/root/shared`` (the user's shared storage) and ``/root`` itself (the
system disk: what "save as image" keeps). A path that leaves ``/root`` (``..``,
absolute elsewhere) is refused naming the field. Downloads stream the file out of
Docker's archive API (a tar stream, unpacked on the fly); uploads are packed
into a tar in a temporary file and put with the same API. Both are limited to
``FILE_TRANSFER_MAX_MB``.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import tempfile

from django.conf import settings

from scheduler.errors import Conflict, InvalidInput
from scheduler.models import WorkloadStatus
from scheduler.node.launcher import docker_client

ROOTS = ("/root/autodl-tmp", "/root/shared", "/root")
HOME = "/root"
LIST_SCRIPT = 'cd -- "$1" && for f in * .[!.]*; do [ -e "$f" ] && stat -c "%s|%F|%n" -- "$f"; done; true'


def safe_path(path: str, *, field: str = "path") -> str:
    """The normalized absolute path if it lies under /root; InvalidInput naming ``field`` otherwise."""
    if not path or "\x00" in path:
        raise InvalidInput("give a path under /root", field=field)
    normal = posixpath.normpath(path if path.startswith("/") else posixpath.join(ROOTS[0], path))
    if not (normal == HOME or normal.startswith(HOME + "/")):
        raise InvalidInput(f"{path!r} is outside /root", field=field)
    return normal


def _container(workload):
    if workload.status != WorkloadStatus.RUNNING:
        raise Conflict(f"files are reachable while the instance runs; it is {workload.status}")
    return docker_client().containers.get(workload.container_name)


def listing(workload, path: str) -> list[dict]:
    directory = safe_path(path)
    result = _container(workload).exec_run(["sh", "-c", LIST_SCRIPT, "sh", directory], user="root")
    if result.exit_code != 0:
        raise InvalidInput(f"{directory} is not a directory", field="path")
    entries = []
    for line in result.output.decode(errors="replace").splitlines():
        size, kind, name = (line.split("|", 2) + ["", ""])[:3]
        entries.append(
            {
                "name": name,
                "path": posixpath.join(directory, name),
                "dir": kind == "directory",
                "size": int(size) if size.isdigit() else None,
            }
        )
    return sorted(entries, key=lambda e: (not e["dir"], e["name"]))


def download(workload, path: str):
    """(file name, size, iterator of byte chunks) of one regular file."""
    target = safe_path(path)
    container = _container(workload)
    try:
        stream, stat = container.get_archive(target)
    except Exception as exc:  # docker.errors.NotFound and friends
        raise InvalidInput(f"no file {target}", field="path") from exc
    if stat.get("mode", 0) & 0o040000 or stat.get("size", 0) > settings.FILE_TRANSFER_MAX_MB * 1024 * 1024:
        raise InvalidInput(
            f"download a regular file of at most {settings.FILE_TRANSFER_MAX_MB} MB (pack folders first)", field="path"
        )
    archive = tarfile.open(fileobj=_Reader(stream), mode="r|")
    member = next(iter(archive))
    body = archive.extractfile(member)

    def chunks():
        while block := body.read(64 * 1024):
            yield block
        archive.close()

    return posixpath.basename(target), member.size, chunks()


def upload(workload, directory: str, name: str, source) -> str:
    """Put an uploaded file (``source``: a file object) into ``directory``; returns its path."""
    folder = safe_path(directory, field="dir")
    if not name or "/" in name or name in (".", ".."):
        raise InvalidInput("a plain file name, without folders", field="file")
    size = getattr(source, "size", None)
    if size is not None and size > settings.FILE_TRANSFER_MAX_MB * 1024 * 1024:
        raise InvalidInput(f"at most {settings.FILE_TRANSFER_MAX_MB} MB per file", field="file")
    container = _container(workload)
    with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024) as packed:
        with tarfile.open(fileobj=packed, mode="w") as archive:
            info = tarfile.TarInfo(name)
            info.size = size if size is not None else _length(source)
            info.mode = 0o644
            archive.addfile(info, source)
        packed.seek(0)
        if not container.put_archive(folder, packed.read()):
            raise InvalidInput(f"could not write into {folder}", field="dir")
    return posixpath.join(folder, name)


def _length(source) -> int:
    here = source.tell()
    source.seek(0, io.SEEK_END)
    end = source.tell()
    source.seek(here)
    return end - here


class _Reader(io.RawIOBase):
    """A file object over Docker's chunk iterator, for tarfile's stream mode."""

    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self._buffer = b""

    def readable(self):
        return True

    def readinto(self, target):
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n
