"""``Client``: the API as typed Python methods (httpx for HTTP, websockets for logs and terminals).

    from gpucloud import Client
    client = Client()                    # the saved profile, or GPUCLOUD_URL / GPUCLOUD_TOKEN
    client = Client(url=..., token=...)  # explicit

Every failed call raises an ``ApiError`` (``NotFound`` for 404, ``AuthError`` for 401/403)
with the HTTP status, the server's sentence and the input field at fault.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import tarfile
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlencode

import httpx
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect as ws_connect

from gpucloud import config
from gpucloud.errors import ApiError, BadResponse, ConfigError, NotFound, error_for, transport_error
from gpucloud.models import Account, ArrayJob, FileEntry, GpuType, Image, Instance, Job, LogEnd, LogLine, StatementLine

KINDS = ("job", "instance")
NDJSON = {"Accept": "application/x-ndjson, application/json;q=0.9"}  # the logs endpoint's formats
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
CHUNK = 1024 * 1024
IDEMPOTENCY = "Idempotency-Key"  # a create carrying one is made once, however often it is sent (the server keeps it)
# Safe to send twice: what HTTP calls idempotent, and a create with its Idempotency-Key.
RESENDABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
# A connection the server closed as it was reused (gunicorn closes an idle keep-alive one after 5 s): the request
# met a closed socket, no answer came. Sent once more, on a new connection, where sending it twice is safe.
STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
RECONNECT_S = (0.5, 1, 2, 5)  # waits between reconnects of a log follow that lost its socket


class LogsUnavailable(ApiError):
    """This server has no logs endpoint (an older version): ``follow_logs`` falls back to the job's status."""


class Client:
    def __init__(
        self, url: str | None = None, token: str | None = None, *, profile: str | None = None, ws_url: str | None = None
    ):
        if url is None:
            saved = config.profile_load(profile)
            url, token, ws_url = saved.url, token or saved.token, ws_url or saved.ws_url
        self.url = url.rstrip("/")
        self.token = token or ""
        self._ws_base = ws_url.rstrip("/") if ws_url else None  # None: ask the server (GET /me/) when needed
        headers = {"Accept": "application/json", "User-Agent": "gpucloud-cli/0.1"}
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        url = f"/api/v1/{path.lstrip('/')}"
        resendable = method in RESENDABLE_METHODS or IDEMPOTENCY in (kwargs.get("headers") or {})
        try:
            try:
                response = self.http.request(method, url, **kwargs)
            except STALE_CONNECTION:
                if not resendable:
                    raise  # a create or an action without a key may have been done: say so, do not repeat it
                response = self.http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise transport_error(self.url, exc) from exc
        self._check(response)
        return response

    def _create(self, path: str, *, model, **kwargs):
        """POST a create with an Idempotency-Key of its own: sent again after a stale connection, it makes one."""
        headers = {IDEMPOTENCY: uuid.uuid4().hex}
        return self._json("POST", path, headers=headers, model=model, **kwargs)

    @staticmethod
    def _check(response: httpx.Response) -> None:
        if response.is_success:
            return
        response.read()
        try:
            body = response.json()
        except ValueError:
            if response.status_code == 404:  # not the API's own 404 (that is JSON): a route it does not have
                raise NotFound(404, f"this server has no {response.request.url.path} (an older version?)") from None
            body = response.text[:200]
        raise error_for(response.status_code, body)

    def _json(self, method: str, path: str, *, shape: type = dict, key: str | None = None, model=None, **kwargs):
        """The answer's JSON (``_answer``), as ``model``'s objects with one."""
        return _answer(self._call(method, path, **kwargs), shape, key, model)

    def _pages(self, path: str, params: dict | None = None, *, model=None) -> Iterator:
        params = {**(params or {}), "page_size": 200}
        page = 1
        while True:
            response = self._call("GET", path, params={**params, "page": page})
            yield from _answer(response, list, "results", model)
            if not response.json().get("next"):
                return
            page += 1

    @property
    def ws_base(self) -> str:
        """Where the server's WebSockets are: its ``websocket_url`` (a separate daphne, as in `make run`), else the
        API's own address as ws:// or wss:// (a proxy sends /ws/ to daphne)."""
        if self._ws_base is None:
            self._ws_base = (self.me().get("websocket_url") or "").rstrip("/")
        if self._ws_base:
            return self._ws_base
        return "wss" + self.url[5:] if self.url.startswith("https") else "ws" + self.url[4:]

    def ws_url(self, path: str, **query) -> str:
        base = self.ws_base
        query = {k: v for k, v in query.items() if v is not None}
        return f"{base}/{path.lstrip('/')}" + (f"?{urlencode(query)}" if query else "")

    def ws_headers(self) -> dict:
        return {"Authorization": f"Token {self.token}"} if self.token else {}

    # -- account ------------------------------------------------------------------------------------

    @staticmethod
    def token_for(url: str, username: str, password: str) -> str:
        """A new API token (``POST /auth/token/``), named for this machine; the user's other tokens keep working."""
        body = {"username": username, "password": password, "name": f"gpucloud CLI on {socket.gethostname()}"[:64]}
        with httpx.Client(base_url=url.rstrip("/"), timeout=TIMEOUT) as http:
            try:
                response = http.post("/api/v1/auth/token/", json=body)
            except httpx.HTTPError as exc:
                raise transport_error(url, exc) from exc
            Client._check(response)
            return _answer(response, str, "token")

    def me(self) -> dict:
        response = self._call("GET", "me/")
        _answer(response, str, "username")  # what every use of it reads
        return response.json()

    def balance(self) -> Account:
        return self._json("GET", "billing/", model=Account)

    def statement(self, month: str | None = None) -> list[StatementLine]:
        params = {"month": month} if month else None
        return self._json("GET", "billing/statement/", shape=list, model=StatementLine, params=params)

    # -- catalog ------------------------------------------------------------------------------------

    def gpu_types(self) -> list[GpuType]:
        return list(self._pages("gpu-types/", model=GpuType))

    def images(self, *, mine: bool = False) -> list[Image]:
        return list(self._pages("images/", {"mine": 1} if mine else None, model=Image))

    def gpu_type_id(self, name_or_id: str | int) -> int:
        """A GPU type's id from its name ("RTX3090", "rtx 3090", "A100-80GB") or id."""
        if isinstance(name_or_id, int) or str(name_or_id).isdigit():
            return int(name_or_id)
        wanted = _squash(str(name_or_id))
        types = self.gpu_types()
        for gpu_type in types:
            if wanted in (_squash(gpu_type.name), _squash(gpu_type.display_name)):
                return gpu_type.id
        known = ", ".join(t.name for t in types)
        raise ApiError(400, f"no GPU type {name_or_id!r} (there are: {known})", field="gpu_type")

    def image_id(self, name_or_id: str | int) -> int:
        """An image's id from its id, name, Docker reference or framework ("pytorch": the newest such)."""
        if isinstance(name_or_id, int) or str(name_or_id).isdigit():
            return int(name_or_id)
        wanted = str(name_or_id).lower()
        images = self.images()
        for match in (
            lambda i: wanted in (i.name.lower(), i.docker_ref.lower()),
            lambda i: i.framework.lower() == wanted,
            lambda i: wanted in i.name.lower() or wanted in i.docker_ref.lower(),
        ):
            found = [i for i in images if match(i)]
            if found:  # the newest version of the framework
                return max(found, key=lambda i: (_version(i.framework_version), i.id)).id
        raise ApiError(400, f"no image {name_or_id!r} (see `gpucloud images`)", field="image")

    # -- jobs ---------------------------------------------------------------------------------------

    def jobs(self) -> list[Job]:
        return list(self._pages("jobs/", model=Job))

    def job(self, job_id: int) -> Job:
        return self._json("GET", f"jobs/{job_id}/", model=Job)

    def submit_job(
        self,
        *,
        command: str,
        image: str | int,
        gpu_type: str | int,
        gpus: float | str | Decimal = 1,
        memory_gb: int | None = None,
        cpu_cores: int | None = None,
        name: str | None = None,
        env: dict[str, str] | None = None,
        spot: bool | None = None,
        priority: str | None = None,
        max_runtime_s: int | None = None,
        team: str | None = None,
        upload: str | os.PathLike | None = None,
        elastic: tuple[int, int] | None = None,
    ) -> Job:
        """Queue a batch job; ``upload``: a folder sent with it (tar.gz), extracted where the command runs;
        ``elastic``: (fewest, most) cards, an elastic job the scheduler resizes within that range."""
        body = self._work_body(
            image=image, gpu_type=gpu_type, gpus=gpus, memory_gb=memory_gb, cpu_cores=cpu_cores, name=name, team=team
        )
        body |= _given(command=command, env=env or None, spot=spot, priority=priority, max_runtime_s=max_runtime_s)
        if elastic is not None:
            body |= {"elastic_min": elastic[0], "elastic_max": elastic[1]}
        return self._create("jobs/", **_with_code(body, upload), model=Job)

    def cancel_job(self, job_id: int) -> Job:
        return self._json("POST", f"jobs/{job_id}/cancel/", model=Job)

    def release_job(self, job_id: int) -> Job:
        return self._json("POST", f"jobs/{job_id}/release/", model=Job)

    def wait_job(self, job_id: int, *, poll_s: float = 1.0, timeout: float | None = None) -> Job:
        """Poll until the job has finished (succeeded, failed, stopped, released); returns it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (job := self.job(job_id)).finished:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job.status}")
            time.sleep(poll_s)
        return job

    # -- arrays (sweeps) ------------------------------------------------------------------------------

    def submit_array(
        self,
        *,
        command: str,
        image: str | int,
        gpu_type: str | int,
        gpus: float | str | Decimal = 1,
        array: str | None = None,
        params: dict[str, list[str]] | None = None,
        max_running: int | None = None,
        spot: bool | None = None,
        fallback: str | None = None,
        budget: str | None = None,
        env: dict[str, str] | None = None,
        memory_gb: int | None = None,
        cpu_cores: int | None = None,
        name: str | None = None,
        team: str | None = None,
        upload: str | os.PathLike | None = None,
    ) -> ArrayJob:
        """A job array: ``array="0-31%4"`` (indices, at most 4 at once) or ``params={"lr": ["1e-3", "3e-4"]}``;
        ``upload``: a folder sent once for the whole array, extracted where each task's command runs."""
        body = self._work_body(
            image=image, gpu_type=gpu_type, gpus=gpus, memory_gb=memory_gb, cpu_cores=cpu_cores, name=name, team=team
        )
        body |= _given(
            command=command, array=array, params=params, max_running=max_running, spot=spot, fallback=fallback,
            budget=budget, env=env or None,
        )  # fmt: skip
        return self._create("arrays/", **_with_code(body, upload), model=ArrayJob)

    def arrays(self) -> list[ArrayJob]:
        return list(self._pages("arrays/", model=ArrayJob))

    def array(self, array_id: int) -> ArrayJob:
        return self._json("GET", f"arrays/{array_id}/", model=ArrayJob)

    def cancel_array(self, array_id: int) -> ArrayJob:
        return self._json("POST", f"arrays/{array_id}/cancel/", model=ArrayJob)

    def retry_array(self, array_id: int) -> ArrayJob:
        return self._json("POST", f"arrays/{array_id}/retry/", model=ArrayJob)

    # -- instances ------------------------------------------------------------------------------------

    def instances(self) -> list[Instance]:
        return list(self._pages("instances/", model=Instance))

    def instance(self, instance_id: int) -> Instance:
        return self._json("GET", f"instances/{instance_id}/", model=Instance)

    def create_instance(
        self,
        *,
        image: str | int,
        gpu_type: str | int,
        gpus: float | str | Decimal = 1,
        memory_gb: int | None = None,
        cpu_cores: int | None = None,
        disk_gb: int | None = None,
        spot: bool = False,
        name: str | None = None,
        team: str | None = None,
    ) -> Instance:
        body = self._work_body(
            image=image, gpu_type=gpu_type, gpus=gpus, memory_gb=memory_gb, cpu_cores=cpu_cores, name=name, team=team
        )
        body |= _given(disk_gb=disk_gb, billing_mode="spot" if spot else None)
        return self._create("instances/", json=body, model=Instance)

    def instance_action(self, instance_id: int, action: str) -> Instance:
        """``action``: start, stop, restart, release, start-no-gpu."""
        return self._json("POST", f"instances/{instance_id}/{action}/", model=Instance)

    def save_image(self, instance_id: int, name: str) -> Image:
        return self._json("POST", f"instances/{instance_id}/save-image/", json={"name": name}, model=Image)

    def _work_body(self, *, image, gpu_type, gpus, memory_gb, cpu_cores, name, team) -> dict:
        return {"image": self.image_id(image), "gpu_type": str(self.gpu_type_id(gpu_type)), "gpus": str(gpus)} | _given(
            memory_gb=memory_gb, cpu_cores=cpu_cores, name=name, team=team
        )

    # -- logs -----------------------------------------------------------------------------------------

    def logs(
        self,
        kind: str,
        object_id: int,
        *,
        tail: int | None = None,
        since: str | None = None,
        after: str | None = None,
        rank: int | None = None,
    ) -> Iterator[LogLine | LogEnd]:
        """The log as it is now (``GET …/logs/``, NDJSON): each line, then its ``LogEnd``; ``rank``: a
        multi-node job's member's lines only."""
        params = _given(tail=tail, since=since, after=after, rank=rank, format="ndjson")
        path = f"/api/v1/{_plural(kind)}/{object_id}/logs/"
        try:
            timeout = httpx.Timeout(None, connect=10)
            with self.http.stream("GET", path, params=params, headers=NDJSON, timeout=timeout) as response:
                if response.status_code == 404 and "json" not in response.headers.get("content-type", ""):
                    raise LogsUnavailable(404, "this server has no logs endpoint")
                self._check(response)
                for text in response.iter_lines():
                    if text.strip():
                        yield _log_item(text)
        except httpx.HTTPError as exc:
            raise transport_error(self.url, exc) from exc

    def follow_logs(
        self,
        kind: str,
        object_id: int,
        *,
        tail: int | None = None,
        since: str | None = None,
        after: str | None = None,
        rank: int | None = None,
    ) -> Iterator[LogLine | LogEnd]:
        """Live lines (ws/logs/…) until the workload ends (a ``LogEnd`` last); a lost socket reconnects with
        ``after=<last cursor>``, so no line comes twice and none is lost."""
        self._logs_probe(kind, object_id)
        failures = 0
        while True:
            query = (_given(after=after) if after else _given(tail=tail, since=since)) | _given(rank=rank)
            url = self.ws_url(f"ws/logs/{_plural(kind)}/{object_id}/", **query)
            try:
                with ws_connect(url, additional_headers=self.ws_headers(), open_timeout=10) as ws:
                    for frame in ws:
                        item = _log_item(frame)
                        if isinstance(item, LogLine) and item.n:
                            after, failures = item.n, 0
                        yield item
                        if isinstance(item, LogEnd):
                            return
                    _refused(ws.close_code, kind, object_id)
                    raise ConnectionError(f"the log socket closed ({ws.close_code}) before the end")
            except InvalidStatus as exc:
                if exc.response.status_code == 404:
                    raise LogsUnavailable(404, "this server has no logs socket") from exc
                raise error_for(exc.response.status_code, exc.response.body.decode(errors="replace")) from exc
            except (ConnectionClosed, InvalidHandshake, OSError, TimeoutError) as exc:
                close = getattr(getattr(exc, "rcvd", None), "code", None)
                _refused(close, kind, object_id)
                if failures >= len(RECONNECT_S):
                    raise ApiError(0, f"the log socket keeps failing: {exc}") from exc
                time.sleep(RECONNECT_S[failures])
                failures += 1

    def _logs_probe(self, kind: str, object_id: int) -> None:
        """LogsUnavailable when this server has no logs API (a version before it); NotFound when no such work."""
        path = f"/api/v1/{_plural(kind)}/{object_id}/logs/"
        try:
            with self.http.stream("GET", path, params={"tail": 1}, headers=NDJSON) as response:
                if response.status_code == 404 and "json" not in response.headers.get("content-type", ""):
                    raise LogsUnavailable(404, "this server has no logs endpoint")
                self._check(response)
        except httpx.HTTPError as exc:
            raise transport_error(self.url, exc) from exc

    # -- files ----------------------------------------------------------------------------------------

    def files(self, kind: str, object_id: int, path: str) -> list[FileEntry]:
        path_ = f"{_plural(kind)}/{object_id}/files/"
        return self._json("GET", path_, shape=list, key="entries", model=FileEntry, params={"path": path})

    def download(self, kind: str, object_id: int, path: str, destination: str | os.PathLike) -> Path:
        """Copy a file out of a running instance or job into ``destination`` (a file, or a folder to put it in)."""
        target = Path(destination)
        url = f"/api/v1/{_plural(kind)}/{object_id}/files/download/"
        try:
            with self.http.stream("GET", url, params={"path": path}, timeout=httpx.Timeout(None, connect=10)) as answer:
                self._check(answer)
                if target.is_dir():
                    target = target / path.rstrip("/").rsplit("/", 1)[-1]
                partial = target.with_name(target.name + ".part")
                with open(partial, "wb") as out:
                    for chunk in answer.iter_bytes(CHUNK):
                        out.write(chunk)
        except httpx.HTTPError as exc:  # the .part file stays: it is not the file
            raise transport_error(self.url, exc) from exc
        partial.replace(target)
        return target

    def upload(self, kind: str, object_id: int, source: str | os.PathLike, folder: str, name: str | None = None) -> str:
        """Copy a local file into ``folder`` of a running instance or job; returns where it now is."""
        source = Path(source)
        params = {"path": folder, "name": name or source.name}
        with open(source, "rb") as body:
            response = self._call(
                "PUT",
                f"{_plural(kind)}/{object_id}/files/upload/",
                params=params,
                content=_chunks(body),
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(source.stat().st_size)},
                timeout=httpx.Timeout(None, connect=10),
            )
        return _answer(response, str, "path")


def _answer(response: httpx.Response, shape: type = dict, key: str | None = None, model=None):
    """The answer's JSON (its member ``key`` with one), checked to be a ``shape`` (a list: of objects), as
    ``model``'s objects with one; ``BadResponse`` naming the request and what came instead otherwise."""
    try:
        body = response.json()
    except ValueError:  # not JSON, or cut short
        raise BadResponse(response, "is not JSON") from None
    if key is not None:
        if not isinstance(body, dict) or key not in body:
            raise BadResponse(response, f"has no {key!r}")
        body = body[key]
    if not isinstance(body, shape) or (shape is list and not all(isinstance(item, dict) for item in body)):
        what = f"its {key!r}" if key else "it"
        raise BadResponse(response, f"is JSON, but {what} is not {_SHAPES.get(shape, shape.__name__)}")
    if model is None:
        return body
    try:
        return [model.from_api(item) for item in body] if shape is list else model.from_api(body)
    except ValueError as exc:
        raise BadResponse(response, f"is JSON, but not {exc}") from None


_SHAPES = {dict: "an object", list: "a list of objects", str: "a string"}


def _with_code(body: dict, upload: str | os.PathLike | None) -> dict:
    """A create request's body: JSON, or with ``upload``'s folder a form with it as ``code`` (objects as JSON)."""
    if upload is None:
        return {"json": body}
    form = {k: json.dumps(v) if isinstance(v, (dict, bool)) else str(v) for k, v in body.items()}
    return {"data": form, "files": {"code": ("code.tar.gz", folder_archive(upload), "application/gzip")}}


def folder_archive(folder: str | os.PathLike) -> bytes:
    """A .tar.gz of ``folder``'s contents (names relative to it), skipping .git and __pycache__."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"--upload wants a folder: {root} is not one")
    skip = {".git", "__pycache__", ".venv", "node_modules"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root)
            if skip & set(relative.parts):
                continue
            tar.add(path, arcname=str(relative), recursive=False)
    return buffer.getvalue()


def _chunks(body) -> Iterator[bytes]:
    while chunk := body.read(CHUNK):
        yield chunk


def _given(**fields) -> dict:
    return {k: v for k, v in fields.items() if v is not None}


def _plural(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind is one of {KINDS}")
    return f"{kind}s"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def _squash(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def _log_item(text: str | bytes) -> LogLine | LogEnd:
    """One NDJSON frame of a log. A frame that is not whole JSON (a server bug) becomes a ``system`` line
    saying so, with its text, rather than ending the log in a traceback."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not ("end" in data or ("n" in data and "line" in data)):
            raise ValueError("not a log line")
    except ValueError:
        shown = text.decode(errors="replace") if isinstance(text, bytes) else text
        return LogLine(n="", t="", stream="system", line=f"… a line of this log could not be read: {shown[:200]}")
    if "end" in data:
        end = data["end"] or {}
        return LogEnd(**{k: end.get(k) for k in ("status", "exit_code", "reason", "cursor", "finished") if k in end})
    rank = data.get("rank")
    return LogLine(
        n=str(data["n"]),
        t=data.get("t", ""),
        stream=data.get("stream", "stdout"),
        line=data["line"],
        rank=rank if isinstance(rank, int) else None,
        host=str(data.get("host") or ""),
    )


def _refused(code: int | None, kind: str, object_id: int) -> None:
    """Raise for a socket the server closed on purpose (not yours, not signed in)."""
    if code == 4404:
        raise NotFound(404, f"no such {kind} of yours: {object_id}")
    if code in (4401, 4403):
        from gpucloud.errors import AuthError

        raise AuthError(401, "the server refused the token (run `gpucloud login`)")
