"""``gpucloud exec``: an interactive shell in a running instance or job over the platform's terminal socket.

The socket (ws/terminal/{instances|jobs}/<id>/) takes JSON text frames
``{"type": "input", "data": ...}`` and ``{"type": "resize", "cols", "rows"}`` and sends the
shell's output as binary frames; when the shell exits, a text frame ``{"exit_code": N}``
and then the close (4000). With a terminal on stdin it is put in raw mode (restored on
exit) and every window resize (SIGWINCH) is sent on; without one (a pipe), the input is
sent as it comes and its end is typed as Ctrl-D, so ``echo 'exit 3' | gpucloud exec ID``
works in scripts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from gpucloud.errors import ApiError, AuthError, NotFound

EOF_KEY = "\x04"  # what a terminal sends for Ctrl-D
CLOSE_REASONS = {
    4401: (AuthError, 401, "the server refused the token, or your password changed (run `gpucloud login`)"),
    4403: (ApiError, 403, "you left the team this {kind} is charged to: its terminal closed"),
    4404: (NotFound, 404, "no such {kind} of yours"),
    4409: (ApiError, 409, "the {kind} is not running (or its host does not answer)"),
    4429: (ApiError, 429, "too many terminal and file sessions open: close one"),
}


def terminal_session(client, kind: str, object_id: int, *, command: str | None = None, tty: bool | None = None) -> int:
    """Run the session to its end; returns the shell's exit code (255 when the server did not say)."""
    url = client.ws_url(f"ws/terminal/{kind}s/{object_id}/")
    stdin, stdout = sys.stdin.fileno(), sys.stdout.buffer
    tty = os.isatty(stdin) if tty is None else tty
    try:
        ws = ws_connect(url, additional_headers=client.ws_headers(), open_timeout=15, max_size=None)
    except InvalidStatus as exc:
        raise ApiError(exc.response.status_code, f"the server refused the terminal: {exc}") from exc
    exit_code: list[int] = []
    with ws, _raw_mode(stdin, tty):

        def send(message: dict) -> None:
            with contextlib.suppress(ConnectionClosed):
                ws.send(json.dumps(message))

        def resize(*_):
            try:  # the window itself: COLUMNS / LINES in the environment (shutil's first choice) never follow a resize
                size = os.get_terminal_size(stdout.fileno())
            except (OSError, ValueError):
                size = shutil.get_terminal_size()
            send({"type": "resize", "cols": size.columns, "rows": size.lines})

        if tty:
            resize()
            previous = signal.signal(signal.SIGWINCH, resize) if hasattr(signal, "SIGWINCH") else None
        if command:
            send({"type": "input", "data": command + "\n"})
        threading.Thread(target=_keys, args=(stdin, send, not tty), daemon=True).start()
        try:
            for frame in ws:
                if isinstance(frame, bytes):
                    stdout.write(frame)
                    stdout.flush()
                else:
                    with contextlib.suppress(ValueError, TypeError, KeyError):
                        exit_code.append(int(json.loads(frame)["exit_code"]))
        except ConnectionClosed:
            pass
        finally:
            if tty and hasattr(signal, "SIGWINCH"):
                signal.signal(signal.SIGWINCH, previous or signal.SIG_DFL)
        code = ws.close_code
    if code in CLOSE_REASONS:
        kind_error, status, text = CLOSE_REASONS[code]
        raise kind_error(status, text.format(kind=kind))
    return exit_code[-1] if exit_code else 255


def _keys(stdin: int, send, eof_as_ctrl_d: bool) -> None:
    """stdin to the shell, as it comes (keystrokes in raw mode, lines from a pipe)."""
    while True:
        try:
            data = os.read(stdin, 4096)
        except OSError:
            return
        if not data:
            if eof_as_ctrl_d:
                send({"type": "input", "data": EOF_KEY})
            return
        send({"type": "input", "data": data.decode(errors="replace")})


@contextlib.contextmanager
def _raw_mode(fd: int, tty: bool):
    if not tty:
        yield
        return
    import termios
    import tty as ttys

    saved = termios.tcgetattr(fd)
    try:
        ttys.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
