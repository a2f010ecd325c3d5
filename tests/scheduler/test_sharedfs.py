"""Reading what juicefs prints: sizes, the quota table, its log lines; URLs without passwords."""

import pytest

from scheduler.sharedfs import GIB, Quota, SharedFsError, last_words, parse_quota_table, parse_size, redact

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
