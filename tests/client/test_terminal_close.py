"""What ``gpucloud exec`` says when the server closes its terminal for a reason of its own (the close codes of
portal/sockets/terminal.py), against a WebSocket server that closes as the web tier does."""

import os
import threading

import pytest
from gpucloud.errors import ApiError, AuthError
from gpucloud.terminal import terminal_session
from websockets.sync.server import serve


class Client:
    def __init__(self, port: int):
        self.port = port

    def ws_url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}/{path}"

    def ws_headers(self) -> dict:
        return {}


@pytest.mark.parametrize(
    ("code", "error", "words"),
    [(4403, ApiError, "you left the team"), (4401, AuthError, "your password changed")],
    ids=["left-the-team", "signed-out"],
)
def test_a_terminal_closed_because_access_ended_says_why(code, error, words, monkeypatch):
    def close(websocket):
        websocket.close(code=code, reason="revoked")

    with serve(close, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        read, write = os.pipe()  # stdin: a pipe, not a terminal
        monkeypatch.setattr("sys.stdin", os.fdopen(read))
        try:
            with pytest.raises(error, match=words):
                terminal_session(Client(server.socket.getsockname()[1]), "job", 7, tty=False)
        finally:
            os.close(write)
            server.shutdown()
