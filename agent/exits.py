"""What a container's exit code says, in the words a job's status reason uses.

A process that ends by itself exits with its own code (0-255); the shell and Docker report a
process ended by signal n as 128 + n. So only 128 + n is a kill or a crash, and 137 (SIGKILL)
is the kernel's out-of-memory killer only when Docker's State.OOMKilled says so.
"""

import signal

# Signals a program raises against itself when it faults: the process crashed.
_CRASHES = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


def signal_of(exit_code: int | None) -> signal.Signals | None:
    """The signal an exit code of 128 + n stands for (None for an ordinary exit)."""
    if exit_code is None or not 128 < exit_code < 128 + signal.NSIG:
        return None
    try:
        return signal.Signals(exit_code - 128)
    except ValueError:
        return None


def exit_reason(exit_code: int | None, *, oom_killed: bool = False) -> str:
    """'exited with code 7'; 'exited with code 137 (out of memory)'; '... (crashed: SIGSEGV)'."""
    said = f"exited with code {exit_code}"
    if oom_killed:
        return f"{said} (out of memory)"
    sig = signal_of(exit_code)
    if sig is None:
        return said
    return f"{said} ({'crashed' if sig in _CRASHES else 'killed'}: {sig.name})"
