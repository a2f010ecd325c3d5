"""A server that answers badly — not JSON (an HTML page, a body cut short), JSON of another shape, a connection
reset or closed mid-answer — gets a sentence naming what was wrong and exit code 1 from every command, never a
Python traceback. The server here is a raw HTTP/1.1 responder on loopback, so the bytes are exactly the fault's."""

import json
import os
import socket
import struct
import subprocess
import sys
import threading

import pytest
from gpucloud import cli

HTML = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


def answer(status: str, kind: str, body: bytes, *, length: int | None = None) -> bytes:
    """An HTTP/1.1 answer; ``length`` None: the body's own, -1: none (the body ends with the connection). Always
    ``Connection: close``, as the server closes after each answer: a client that kept the connection for its next
    request would meet a reset or not depending on timing (``ps`` asks twice)."""
    length = len(body) if length is None else length
    said = b"Connection: close\r\n" + (b"" if length < 0 else b"Content-Length: %d\r\n" % length)
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\n%s\r\n%s" % (status.encode(), kind.encode(), said, body)


WRONG_TYPES = {"results": [{"id": 1, "name": 2, "status": [], "gpus": {}}], "next": None, "id": 1, "name": 2}
WRONG_TYPES |= {"status": [], "username": [1], "currency": 5, "balance": {}, "entries": [{"name": 1}]}
CUT = b'{"results": [{"id": 1, "status": "runn'
ANSWERS = {  # mode: the bytes answered (None: the connection is reset instead)
    "html_error_page": answer("502 Bad Gateway", "text/html", HTML),
    "html_page_ok": answer("200 OK", "text/html", HTML),
    "json_list": answer("200 OK", "application/json", b"[1, 2, 3]"),
    "json_list_of_numbers": answer("200 OK", "application/json", b'{"results": [1, 2], "next": null}'),
    "wrong_types": answer("200 OK", "application/json", json.dumps(WRONG_TYPES).encode()),
    "json_cut_short": answer("200 OK", "application/json", CUT, length=-1),
    "fewer_bytes_than_said": answer("200 OK", "application/json", CUT, length=4000),
    "reset": None,
}
# What the sentence says (one of these), by fault.
SAID = {
    "html_error_page": ("HTTP 502: <!DOCTYPE html> <html><head><title>502 Bad Gateway</title>",),
    "html_page_ok": ("is not JSON (text/html, 90 bytes: '<!DOCTYPE html> <html><head><title>502 Bad Gateway",),
    "json_list": (
        "is JSON, but it is not an object",
        "is JSON, but it is not a list of objects",
        "has no 'results' (application/json, 9 bytes: '[1, 2, 3]')",
        "has no 'username'",
    ),
    "json_list_of_numbers": ("is not a list of objects", "is JSON, but not a", "has no 'username'"),
    "json_cut_short": ('is not JSON (application/json, 38 bytes: \'{"results": [{"id": 1, "status": "runn\')',),
    "fewer_bytes_than_said": ("broke before the whole answer came",),
    "reset": ("broke before the whole answer came",),
}


class BadServer:
    """Answers every request the same broken way (``mode``); counts the requests it read."""

    def __init__(self):
        self.mode, self.requests = "reset", 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                length = next((int(line.split(b":")[1]) for line in request.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                body = request.split(b"\r\n\r\n", 1)[-1]
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests += 1
                if ANSWERS[self.mode] is None:  # RST at once: no answer at all
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    continue
                conn.sendall(ANSWERS[self.mode])

    def close(self):
        self.listener.close()


@pytest.fixture(scope="module")
def bad_server():
    server = BadServer()
    yield server
    server.close()


def gpucloud(server, capsys, monkeypatch, *args: str) -> tuple[int, str]:
    monkeypatch.setenv("GPUCLOUD_URL", server.url)
    monkeypatch.setenv("GPUCLOUD_TOKEN", "gpc_test")
    monkeypatch.setenv("GPUCLOUD_WS_URL", server.url.replace("http", "ws"))
    monkeypatch.delenv("GPUCLOUD_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["gpucloud", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    return exited.value.code, " ".join(capsys.readouterr().err.split())  # rich wraps at the terminal's width


COMMANDS = [["ps"], ["show", "j1"], ["balance"], ["whoami"], ["usage"], ["offers"], ["arrays"], ["cancel", "j1"]]


@pytest.mark.parametrize("mode", list(SAID))
def test_every_command_says_what_was_wrong_with_the_answer_and_exits_1(bad_server, capsys, monkeypatch, mode):
    bad_server.mode = mode
    for command in COMMANDS:
        before = bad_server.requests
        code, said = gpucloud(bad_server, capsys, monkeypatch, *command)
        assert bad_server.requests > before, command  # the answer it judged came from this server
        assert code == 1, (command, said)
        assert "Traceback" not in said and said.startswith("gpucloud: "), (command, said)
        assert "unexpected" not in said, (command, said)  # named by the client's own checks, not the last net
        assert any(sentence in said for sentence in SAID[mode]), (command, said)
        if mode not in ("reset", "fewer_bytes_than_said", "html_error_page"):
            assert "the server's answer to GET /api/v1/" in said or "answer to POST /api/v1/jobs/1/cancel/" in said


def test_an_object_with_fields_of_the_wrong_types_is_a_sentence_too(bad_server, capsys, monkeypatch):
    """What the client's shape checks let through (a field of another type) is shown as it came or, where it
    cannot be, ends in the last net: one sentence and exit code 1. GPUCLOUD_DEBUG=1 shows the traceback."""
    bad_server.mode = "wrong_types"
    caught = []
    for command in COMMANDS:
        code, said = gpucloud(bad_server, capsys, monkeypatch, *command)
        assert "Traceback" not in said, (command, said)
        assert code == 0 or (code == 1 and said.startswith("gpucloud: ")), (command, code, said)
        caught += [command] if said.startswith("gpucloud: unexpected ") else []
    assert caught  # the net was reached (balance's arithmetic on a dict, ...)
    monkeypatch.setattr(sys, "argv", ["gpucloud", *caught[0]])
    monkeypatch.setenv("GPUCLOUD_DEBUG", "1")
    with pytest.raises(Exception) as raised:
        cli.main()
    assert not isinstance(raised.value, SystemExit)


def test_the_installed_command_prints_no_traceback_for_a_page_that_is_not_json(bad_server):
    bad_server.mode = "html_page_ok"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLOUD_")}
    environment |= {"GPUCLOUD_URL": bad_server.url, "GPUCLOUD_TOKEN": "gpc_test", "NO_COLOR": "1", "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "gpucloud", "ps"], capture_output=True, text=True, env=environment, timeout=60
    )
    assert done.returncode == 1
    said = "gpucloud: the server's answer to GET /api/v1/jobs/ is not JSON (text/html"
    assert done.stderr.startswith(said), done.stderr
    assert "Traceback" not in done.stderr
