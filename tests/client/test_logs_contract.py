"""The SDK's and CLI's log follow against the logs contract of issue 16 (a stand-in server speaking it): a socket
lost mid-way is reopened with ``after=<last cursor>``, so no line comes twice and none is lost, and the CLI
exits with the job's exit code from the ``end`` frame.

The real endpoint comes from another branch (helper "logs"); ``test_cli.py`` follows a real job through it
once merged (and through the job's status and log tail before that).
"""

import json
import os
import subprocess
import sys
import threading
from urllib.parse import parse_qs, urlsplit

import pytest
from gpucloud import Client, LogEnd, LogLine
from websockets.sync.server import serve

LINES = [{"n": f"{i:04d}", "t": "2026-12-01T07:40:00Z", "stream": "stdout", "line": f"step {i}"} for i in range(1, 6)]
END = {"end": {"status": "failed", "exit_code": 9, "reason": "exited with code 9", "cursor": "0005", "finished": True}}


@pytest.fixture
def logs_server():
    """ws/logs/jobs/1/: the first connection sends three lines and drops; later ones resume after ``after``."""
    seen_queries: list[dict] = []

    def handler(ws):
        query = parse_qs(urlsplit(ws.request.path).query)
        seen_queries.append({k: v[0] for k, v in query.items()} | {"auth": ws.request.headers.get("Authorization")})
        after = query.get("after", [""])[0]
        pending = [line for line in LINES if line["n"] > after]
        if len(seen_queries) == 1:
            for line in pending[:3]:
                ws.send(json.dumps(line))
            ws.close(code=1011, reason="the web server restarts")
            return
        for line in pending:
            ws.send(json.dumps(line))
        ws.send(json.dumps(END))
        ws.close(code=1000)

    def http(connection, request):
        if request.path.startswith("/api/v1/"):  # the HTTP probe: this server has a logs endpoint
            return connection.respond(200, "")
        return None

    with serve(handler, "127.0.0.1", 0, process_request=http) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}", seen_queries
        server.shutdown()


def test_a_follow_that_loses_its_socket_resumes_after_its_last_line_and_ends_with_the_exit_code(logs_server):
    url, queries = logs_server
    items = list(Client(url=url, token="k3y", ws_url="ws" + url[4:]).follow_logs("job", 1, tail=100))
    lines = [item.n for item in items if isinstance(item, LogLine)]
    assert lines == ["0001", "0002", "0003", "0004", "0005"], "each line once, in order"
    assert items[-1] == LogEnd(status="failed", exit_code=9, reason="exited with code 9", cursor="0005")
    assert queries[0] == {"tail": "100", "auth": "Token k3y"}
    assert queries[1] == {"after": "0003", "auth": "Token k3y"}, "the reconnect asks for what comes after"


def test_the_cli_prints_the_followed_lines_and_exits_with_the_jobs_exit_code(logs_server, tmp_path):
    url, _ = logs_server
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLOUD_")}
    env |= {"GPUCLOUD_URL": url, "GPUCLOUD_TOKEN": "k3y", "GPUCLOUD_WS_URL": "ws" + url[4:]}
    env |= {"XDG_CONFIG_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "gpucloud", "logs", "-f", "j1"],
        capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 9, done.stderr
    assert done.stdout.splitlines() == [f"step {i}" for i in range(1, 6)]
