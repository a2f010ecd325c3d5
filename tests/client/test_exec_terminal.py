"""``gpucloud exec -it`` on a real terminal (a pty): raw mode, the window's size and its changes (SIGWINCH)
reaching the shell in a running job, the shell's exit code, and the terminal restored afterwards."""

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from portal.models import Job
from tests.conftest import TEST_IMAGE, wait_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
CURSOR_QUERY, CURSOR_REPLY = b"\x1b[6n", b"\x1b[1;1R"  # busybox's line editor asks; a terminal answers


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Screen:
    """The terminal's side of the pty: what the CLI printed, read until some text shows."""

    def __init__(self, master: int):
        self.master, self.text = master, b""

    def until(self, wanted: bytes, timeout: float = 20, *, since: int = 0) -> None:
        """Read until ``wanted`` shows (after offset ``since`` of what was printed)."""
        deadline = time.monotonic() + timeout
        while wanted not in self.text[since:]:
            left = deadline - time.monotonic()
            assert left > 0, f"no {wanted!r} on the screen: {self.text[-400:]!r}"
            if select.select([self.master], [], [], left)[0]:
                chunk = os.read(self.master, 4096)
                if CURSOR_QUERY in chunk:
                    os.write(self.master, CURSOR_REPLY)
                self.text += chunk

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)


def test_exec_it_is_a_raw_terminal_that_follows_the_windows_size_and_exits_with_the_shells_code(
    cli, catalog, node_worker
):
    started = cli(
        "submit", "-d", "--gpu-type", "RTX3090", "--gpus", "0.5", "--memory", "1G", "--cpus", "1",
        "--image", TEST_IMAGE, "--", "sleep", "600",
    )  # fmt: skip
    job = Job.objects.get(pk=int(started.stdout))
    wait_status(job.workload, "running")

    master, slave = pty.openpty()
    set_size(slave, 30, 100)
    cooked = termios.tcgetattr(slave)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLOUD_")}
    environment |= {"GPUCLOUD_URL": cli.url, "GPUCLOUD_TOKEN": cli.token, "XDG_CONFIG_HOME": cli.config_home}
    # As a login shell may export them (pytest-xdist's workers do: 80 x 24): the window's own size must win.
    environment |= {"COLUMNS": "80", "LINES": "24"}

    def controlling_terminal():  # as a login shell's terminal: its size changes signal the CLI (SIGWINCH)
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", "exec", "-it", f"j{job.pk}"],
        stdin=slave, stdout=slave, stderr=slave, env=environment, start_new_session=True,
        preexec_fn=controlling_terminal,
    )  # fmt: skip
    screen = Screen(master)
    try:
        screen.until(b"# ")
        screen.type(b"stty size\r")
        screen.until(b"30 100")
        set_size(master, 40, 120)  # the kernel sends SIGWINCH to the CLI, which tells the shell
        for _ in range(5):  # the keys may overtake the resize frame (two threads): ask again after a prompt
            mark = len(screen.text)
            screen.type(b"stty size\r")
            screen.until(b"\n~ # ", since=mark)
            if b"40 120" in screen.text[mark:]:
                break
        assert b"40 120" in screen.text
        screen.type(b"echo typed-$((6*7)); exit 6\r")
        screen.until(b"typed-42")
        assert process.wait(30) == 6
        assert termios.tcgetattr(slave) == cooked, "the terminal is back in its cooked mode"
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
        os.close(slave)
