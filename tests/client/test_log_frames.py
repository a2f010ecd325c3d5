"""A log frame the client cannot read becomes a line saying so, not a traceback (``gpucloud logs`` crashed
with a JSONDecodeError on a log broken on the server's side)."""

from gpucloud.client import _log_item
from gpucloud.models import LogEnd, LogLine


def test_a_whole_frame_is_a_line_or_the_end():
    line = _log_item('{"n":"0000001.0000000002","t":"2026-12-04T10:00:00.000000Z","stream":"stdout","line":"step 2"}')
    assert line == LogLine(n="0000001.0000000002", t="2026-12-04T10:00:00.000000Z", stream="stdout", line="step 2")
    assert isinstance(_log_item(b'{"end": {"status": "succeeded", "exit_code": 0}}'), LogEnd)


def test_a_frame_cut_in_half_is_a_system_line_that_shows_it():
    broken = '{"n":"0000001.0000000003","t":"2026-12-04T10:00:01.0000'
    item = _log_item(broken)
    assert item.stream == "system" and item.n == "" and broken in item.line
    assert _log_item("[1, 2]").stream == "system"
