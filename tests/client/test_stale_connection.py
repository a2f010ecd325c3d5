"""A keep-alive connection the server closes as the client reuses it (gunicorn's ``keepalive = 5``: an idle one
is closed after 5 s, and a request sent on it at that moment gets no answer) costs a request sent again, where
sending it twice is safe: reads, and creates, which carry an Idempotency-Key of their own so that the server makes
one. An action without a key (cancel, stop) is not repeated: it may have been done, and the error says the
connection broke. The server here is a raw HTTP/1.1 responder on loopback: each connection answers its first
request and closes, unanswered, on its second, as the race does."""

import json
import socket
import threading

import pytest
from gpucloud import Client
from gpucloud.errors import ApiError

ME = {"username": "demo", "id": 1}
JOB = {"id": 7, "name": "train", "status": "queued", "command": "true"}


class StaleServer:
    def __init__(self):
        self.seen = []  # (connection number, request line, Idempotency-Key or None)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        number = 0
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            number += 1
            threading.Thread(target=self._connection, args=(conn, number), daemon=True).start()

    def _connection(self, conn, number):
        with conn:
            buffered = b""
            for nth in (1, 2):
                while b"\r\n\r\n" not in buffered:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                length = int(headers.get("content-length", 0))
                while len(buffered) < length:
                    buffered += conn.recv(65536)
                buffered = buffered[length:]
                self.seen.append((number, lines[0], headers.get("idempotency-key")))
                if nth == 2:
                    return  # closed as it was reused: no answer
                body = json.dumps(JOB if lines[0].startswith("POST") else ME).encode()
                status = b"201 Created" if lines[0].startswith("POST") else b"200 OK"
                conn.sendall(
                    b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (status, len(body), body)
                )

    def close(self):
        self.listener.close()


@pytest.fixture
def server():
    s = StaleServer()
    yield s
    s.close()


@pytest.fixture
def client(server):
    with Client(server.url, "token") as c:
        yield c


def test_a_read_on_a_connection_closed_as_it_was_reused_is_sent_again(server, client):
    assert client.me()["username"] == "demo"  # connection 1, kept alive
    assert client.me()["username"] == "demo"  # sent on 1, closed unanswered; sent again on 2
    assert [(n, line.split()[0]) for n, line, _ in server.seen] == [(1, "GET"), (1, "GET"), (2, "GET")]


def test_a_create_is_sent_again_with_the_same_key_so_the_server_makes_one(server, client):
    client.me()
    job = client.submit_job(command="true", image=1, gpu_type=1, gpus=1)
    assert job.id == 7
    posts = [(n, key) for n, line, key in server.seen if line.startswith("POST /api/v1/jobs/")]
    assert [n for n, _ in posts] == [1, 2]  # the stale connection, then a new one
    assert posts[0][1] and posts[0][1] == posts[1][1]  # one key: the server answers the second with the first


def test_an_action_without_a_key_is_not_repeated_and_the_error_says_the_connection_broke(server, client):
    client.me()
    with pytest.raises(ApiError, match="broke before the whole answer came"):
        client.cancel_job(7)
    assert [line for _, line, _ in server.seen if line.startswith("POST")] == ["POST /api/v1/jobs/7/cancel/ HTTP/1.1"]
