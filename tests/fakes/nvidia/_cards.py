"""The fake cards and the state the fakes share: compute modes, which processes hold a card, which fake
processes run (so that a fixture can end them). Standard library only: the fakes run with the system
``python3``. What each number comes from is in the package docstring (``tests/fakes/nvidia/__init__.py``).

State directory (``FAKE_NVIDIA_STATE``)::

    bin/                        the tools and python3, for PATH (made by the fixture, ``FakeNvidia``)
    declared                    the declared cards, one ``GPU-<uuid>:<MiB>[:<name>[:<SMs>]]`` a line
    cards/<uuid>/compute_mode   DEFAULT | EXCLUSIVE_PROCESS | PROHIBITED (absent: DEFAULT)
    cards/<uuid>/holders/<pid>  a process with a context on the card (an MPS server, a client without MPS)
    daemons/<pid>, clients/<pid>  fake control daemons and fake CUDA clients that are running

Every pid file holds the process's start time (``/proc/<pid>/stat``), so a file left by a killed process
(or a pid used again) reads as gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DRIVER = "580.159.04"  # every run's ``card`` step
CUDA_VERSION = "13.0"  # ``nvidia-smi``'s header, every run
DEFAULT_NAME = "NVIDIA H200"
DEFAULT_SMS = 132  # ``alone``: sm_count 132 with the whole card
IDLE_USED_MB = 615  # ``nvml``: memory.used of the idle card; ``alone`` grabbed 142,336 of 143,771 MiB
BLOCK_MB = 512  # the measuring program grabbed 512 MiB at a time
# Bus numbers of an HGX H200 board's eight cards, for ``00000000:XX:00.0`` (not measured: invented).
BUS_NUMBERS = (0x19, 0x3B, 0x4C, 0x5D, 0x9B, 0xBB, 0xCB, 0xDB)
DEFAULT, EXCLUSIVE, PROHIBITED = "DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED"
SHOWN = {DEFAULT: "Default", EXCLUSIVE: "Exclusive_Process", PROHIBITED: "Prohibited"}  # ``compute_mode`` query
BUSY = "CUDA-capable device(s) is/are busy or unavailable"  # cudaErrorDevicesUnavailable, ``bypass``
NO_DEVICE = "no CUDA-capable device is detected"  # cudaErrorNoDevice (no card declared or visible)


@dataclass(frozen=True)
class Card:
    index: int
    uuid: str
    memory_mb: int
    name: str = DEFAULT_NAME
    sms: int = DEFAULT_SMS

    @property
    def bus_id(self) -> str:
        number = BUS_NUMBERS[self.index] if self.index < len(BUS_NUMBERS) else 0x19 + self.index
        return f"00000000:{number:02X}:00.0"

    def spec(self) -> str:
        return f"{self.uuid}:{self.memory_mb}:{self.name}:{self.sms}"


def parse_cards(text: str) -> list[Card]:
    """``GPU-<uuid>:<MiB>[:<name>[:<SMs>]]`` entries, separated by commas or new lines."""
    found = []
    for entry in text.replace("\n", ",").split(","):
        fields = [field.strip() for field in entry.split(":")]
        if not fields[0]:
            continue
        if len(fields) < 2 or not fields[1].isdigit():
            raise ValueError(f"a fake card is GPU-<uuid>:<memory MiB>[:<name>[:<SMs>]], not {entry!r}")
        name = fields[2] if len(fields) > 2 and fields[2] else DEFAULT_NAME
        sms = int(fields[3]) if len(fields) > 3 and fields[3].isdigit() else DEFAULT_SMS
        found.append(Card(len(found), fields[0], int(fields[1]), name, sms))
    return found


def state_dir() -> Path | None:
    value = os.environ.get("FAKE_NVIDIA_STATE")
    return Path(value) if value else None


def all_cards() -> list[Card]:
    """The declared cards: ``FAKE_NVIDIA_CARDS``, else the state directory's ``declared`` file."""
    spec = os.environ.get("FAKE_NVIDIA_CARDS")
    state = state_dir()
    if spec is None and state is not None:
        with contextlib.suppress(OSError):
            spec = (state / "declared").read_text()
    return parse_cards(spec or "")


def visible(cards: list[Card], spec: str | None) -> list[Card]:
    """The cards ``CUDA_VISIBLE_DEVICES`` leaves, in its order: indexes or UUIDs (a UUID's first characters,
    ``GPU-`` included, are enough, as NVIDIA's MPS guide says); enumeration stops at the first entry that
    names no card, as CUDA's does."""
    if spec is None:
        return list(cards)
    chosen: list[Card] = []
    for entry in (e.strip() for e in spec.split(",")):
        if entry.isdigit() and int(entry) < len(cards):
            card = cards[int(entry)]
        else:
            matches = [c for c in cards if entry.startswith("GPU-") and c.uuid.startswith(entry)]
            if len(matches) != 1:
                break
            card = matches[0]
        if card in chosen:
            break
        chosen.append(card)
    return chosen


def find(cards: list[Card], name: str) -> Card | None:
    """A card by index, full UUID or PCI bus id (``nvidia-smi -i``)."""
    for card in cards:
        if name == str(card.index) or name == card.uuid or name.upper() == card.bus_id:
            return card
    return None


# --- processes -----------------------------------------------------------------------------------------


def started(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def alive(pid: int, start: str | None) -> bool:
    return start is not None and started(pid) == start


def _mkdir(path: Path, mode: int) -> Path:
    """A directory every uid may use (clients run as other users); the mode set past the umask."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            path.chmod(mode)
    return path


def register(kind: str, pid: int | None = None) -> None:
    """Writes down a running fake (``daemons`` or ``clients``) for the fixture to end."""
    state = state_dir()
    if state is None:
        return
    pid = pid or os.getpid()
    with contextlib.suppress(OSError):
        (_mkdir(state / kind, 0o1777) / str(pid)).write_text(started(pid) or "")


def unregister(kind: str, pid: int | None = None) -> None:
    state = state_dir()
    if state is not None:
        with contextlib.suppress(OSError):
            (state / kind / str(pid or os.getpid())).unlink()


def registered(state: Path, kind: str) -> list[int]:
    """Those of a kind still running."""
    pids = []
    with contextlib.suppress(OSError):
        for entry in (state / kind).iterdir():
            with contextlib.suppress(OSError, ValueError):
                if alive(int(entry.name), entry.read_text()):
                    pids.append(int(entry.name))
    return pids


# --- cards' state --------------------------------------------------------------------------------------


def card_dir(card: Card) -> Path | None:
    state = state_dir()
    if state is None:
        return None
    base = _mkdir(state / "cards" / card.uuid, 0o755)
    _mkdir(base / "holders", 0o1777)
    return base


def compute_mode(card: Card) -> str:
    base = card_dir(card)
    try:
        mode = (base / "compute_mode").read_text().strip() if base else DEFAULT
    except OSError:
        return DEFAULT
    return mode if mode in SHOWN else DEFAULT


def set_compute_mode(card: Card, mode: str) -> None:
    base = card_dir(card)
    if base is None:
        raise OSError("FAKE_NVIDIA_STATE is not set: no place for the compute mode")
    (base / "compute_mode").write_text(mode)


@contextlib.contextmanager
def card_lock(card: Card) -> Iterator[None]:
    """Serializes the check-and-hold of a card between fake processes."""
    base = card_dir(card)
    if base is None:
        yield
        return
    path = base / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def holders(card: Card) -> list[int]:
    """Processes that hold a context on the card now."""
    base = card_dir(card)
    if base is None:
        return []
    pids = []
    for entry in (base / "holders").iterdir():
        try:
            pid, start = int(entry.name), entry.read_text()
        except (OSError, ValueError):
            continue
        if alive(pid, start):
            pids.append(pid)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    return pids


def hold(card: Card, pid: int) -> None:
    base = card_dir(card)
    if base is not None:
        (base / "holders" / str(pid)).write_text(started(pid) or "")


def release(card: Card, pid: int) -> None:
    base = card_dir(card)
    if base is not None:
        with contextlib.suppress(OSError):
            (base / "holders" / str(pid)).unlink()


def refuses_context(card: Card, pid: int) -> bool:
    """Whether the card's compute mode refuses a new context to ``pid``: PROHIBITED always;
    EXCLUSIVE_PROCESS while another process holds one (measured: ``bypass``, ``eager_server``)."""
    mode = compute_mode(card)
    return mode == PROHIBITED or (mode == EXCLUSIVE and any(p != pid for p in holders(card)))


# --- limits as a client sees them ----------------------------------------------------------------------


def sm_count(card: Card, percentage: float) -> int:
    """SMs a client is given: the percentage of the card's, rounded down to an even number (measured:
    50 % -> 66, 25 % -> 32, of 132)."""
    count = int(card.sms * percentage // 100)
    return max(2, count - count % 2)


def grabbed_mb(card: Card, limit_mb: int | None) -> int:
    """What the measuring program got, 512 MiB at a time: under a limit, the limit less 512 MiB in whole
    blocks (71,885 -> 71,168; 35,942 -> 35,328); without one, the idle card's free memory alike
    (143,771 - 615 -> 142,336)."""
    ceiling = card.memory_mb - IDLE_USED_MB
    if limit_mb is not None:
        ceiling = min(ceiling, limit_mb)
    return max(0, (ceiling - BLOCK_MB) // BLOCK_MB * BLOCK_MB)
