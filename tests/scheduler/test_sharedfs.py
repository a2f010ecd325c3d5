"""Reading what juicefs prints: sizes, the quota table, its log lines; URLs without passwords."""

import subprocess
import time
from urllib.parse import quote

import pytest
import redis

from scheduler import sharedfs
from scheduler.sharedfs import GIB, Quota, SharedFsError, last_words, parse_quota_table, parse_size, redact
from tests.ports import free_port

TABLE = """\
+-----------+---------+--------+------+-----------+-------+-------+
|  Path/ID  |   Size  |  Used  | Use% |   Inodes  | IUsed | IUse% |
+-----------+---------+--------+------+-----------+-------+-------+
| /users/20 |  51 MiB |    0 B |   0% | unchanged |     0 |       |
| /users/7  | 1.0 GiB | 30 MiB |   2% | unchanged |     1 |       |
| /scratch  | unchanged | 4.0 KiB |    | 1,000 |     1 |   0% |
+-----------+---------+--------+------+-----------+-------+-------+
"""


@pytest.mark.parametrize(
    ("text", "size"),
    [("0 B", 0), ("9 B", 9), ("51 MiB", 51 * 1024**2), ("1.0 GiB", GIB), ("1.5 TiB", int(1.5 * 1024**4))],
)
def test_sizes_are_read_as_juicefs_prints_them(text, size):
    assert parse_size(text) == size


def test_a_size_it_cannot_read_is_an_error_not_a_zero():
    with pytest.raises(SharedFsError, match="cannot read the size"):
        parse_size("lots")


def test_the_quota_table_gives_each_directorys_usage_and_limit():
    assert parse_quota_table(TABLE) == {
        "/users/20": Quota(used_bytes=0, quota_bytes=51 * 1024**2),
        "/users/7": Quota(used_bytes=30 * 1024**2, quota_bytes=GIB),
    }  # an inodes-only quota has no space limit: left out
    assert parse_quota_table("") == {}


def test_juicefs_log_lines_are_shortened_to_what_they_say():
    log = (
        "2026/11/30 21:34:04.858226 juicefs[22633] <INFO>: Meta address: x [NewClient@interface.go:645]\n"
        "2026/11/30 21:34:04.865698 juicefs[22633] <FATAL>: Meta x is not available: ping database: refused "
        "[NewClient@interface.go:657]\n"
    )
    assert last_words(log) == "Meta x is not available: ping database: refused"
    assert last_words("") == "no output"


def test_passwords_never_reach_a_message():
    assert redact("postgres://fs:s3cret@10.231.0.1:5432/fs") == "postgres://fs:***@10.231.0.1:5432/fs"
    assert redact("redis://:pw@host:6379/2") == "redis://:***@host:6379/2"
    assert redact("sqlite3:///var/meta.db") == "sqlite3:///var/meta.db"


@pytest.fixture
def redis_with_password():
    """A Redis of its own on a free loopback port that asks for a password (given on its standard input)."""
    password = "s3c:r@t/%pw"
    port = free_port()
    server = subprocess.Popen(["redis-server", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    server.stdin.write(f'port {port}\nbind 127.0.0.1\nsave ""\nrequirepass "{password}"\n')
    server.stdin.close()
    client = redis.Redis(port=port, password=password)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or server.poll() is not None:
                pytest.fail("the test's redis-server did not start")
            time.sleep(0.05)
    yield port, password
    server.terminate()
    server.wait(timeout=10)


def test_the_metadata_password_goes_to_juicefs_in_its_environment_never_on_a_command_line(
    settings, tmp_path, redis_with_password, monkeypatch
):
    """A real juicefs formats a volume on a Redis that asks for a password: it got the password (else the format
    fails), and no command line it ran with carried it (``ps`` shows command lines to anyone on the host)."""
    port, password = redis_with_password
    settings.SHARED_FS_META = f"redis://:{quote(password, safe='')}@127.0.0.1:{port}/1"
    settings.SHARED_FS_STORAGE, settings.SHARED_FS_BUCKET = "file", f"{tmp_path}/data/"
    settings.SHARED_FS_NAME = "gs-meta-password"
    runs = []
    real_run = subprocess.run

    def recorded(command, **kwargs):
        runs.append((command, kwargs.get("env") or {}))
        return real_run(command, **kwargs)

    monkeypatch.setattr(sharedfs.subprocess, "run", recorded)
    assert sharedfs.volume_format() is True
    assert sharedfs.volume_settings()["Name"] == "gs-meta-password"
    assert len(runs) >= 3  # status, format, status
    for command, env in runs:
        assert not any(password in part or quote(password, safe="") in part for part in command), command
        assert env.get("META_PASSWORD") == password


def test_a_secret_is_read_from_its_file_each_time_it_is_needed(settings, tmp_path, monkeypatch):
    """SHARED_FS_SECRET_KEY_FILE (a GPU server's NODE_SECRETS_DIR): read when juicefs needs it, into its environment."""
    from core.secrets import secret

    (tmp_path / "key").write_text("s3-secret\n")
    monkeypatch.setenv("SHARED_FS_SECRET_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.setenv("SHARED_FS_SECRET_KEY", "not-this")
    monkeypatch.delenv("SHARED_FS_ACCESS_KEY", raising=False)
    assert (secret("SHARED_FS_SECRET_KEY"), secret("SHARED_FS_ACCESS_KEY")) == ("s3-secret", "")
    (tmp_path / "key").write_text("rotated\n")
    assert secret("SHARED_FS_SECRET_KEY") == "rotated"  # read each time: a rotated key needs no restart
