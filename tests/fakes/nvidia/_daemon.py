"""Fake ``nvidia-cuda-mps-control``'s daemon (``-d``, ``-f``, ``-M``; the command line and front-end are
``_control.py``) and the servers it starts. What each answer comes from is in the package docstring.

The daemon and its front-end and clients talk JSON lines over the pipe directory's unix sockets (the real
wire protocol is NVIDIA's and undocumented); what is modelled is what a caller sees: the files, the
answers, who may do what (by ``SO_PEERCRED`` and by which socket), the servers as real processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import _cards as cards
from _control import ERR_CONNECT, log_directory, pipe_directory, send

# Measured answers (runs 1, 2, 5, 6: ``said``, ``raw``).
INSUFFICIENT = (
    "Insufficient privileges for UID {uid}. Control deamon settings can only be modified by the user who "
    "started it or by the root user."
)
QUIT_REFUSED = "Not enough privilege to execute quit command"
NO_SERVER = "Server {pid} not found"
NO_SERVERS = "Server not found"
UNKNOWN = 'Unknown command "{command}"'
TERMINATE_REFUSED_CODE = "800"  # printed under the refusal of terminate_client (runs 2, 6)
# Strings in the r535/r555 binaries (``strings`` of Debian's nvidia-cuda-mps packages); when each is printed
# is a guess.
ALREADY_RUNNING = "An instance of this daemon is already running"
ROOT_ONLY_MULTIUSER = "Only root user may enable -multiuser-server!"
BAD_PERCENTAGE = "Invalid percentage, expected between (0.0, 100.0]"
BAD_DEVICE = "Invalid device ordinal!"
NO_DEFAULT_LIMIT = "No default pinned memory limit set for the device!"
NEEDS_UID = "A user id (UID) is required to start a new server"
NEEDS_PID = "A server PID is required"
BAD_PRIORITY = "Invalid priority value - must be 0 or 1!"
BAD_PROCESS = "Invalid process {pid}!"
SERVER_FAILED = "MPS server failed to start"  # the MPS guide's server.log example
# Invented here (nothing measured or documented says what the real tool prints).
BAD_LIMIT = "Invalid memory limit {value!r}: an integer followed by G or M"
NO_LIMIT = "No pinned memory limit set for the device!"
NOT_MODELLED = 'fake nvidia-cuda-mps-control: "{command}" is not modelled (its output was never measured)'
SERVER_BUSY = "Cannot start a server for UID {uid}: server {pid} of UID {owner} still has clients"
# CUDA's error strings a client reports (cudaErrorMps*).
ERR_NOT_READY = "MPS server is not ready to accept new MPS client requests"  # 807, the MPS guide (FAULT)

PS_HEADER = "PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND        "
# The server: a real process, so its pid is real, named nvidia-cuda-mps-server; it lives until the daemon
# closes its standard input (so it dies with the daemon). ``cat``: any uid can run it.
SERVER_PROGRAM = shutil.which("cat") or "/bin/cat"
LIMIT = re.compile(r"^(\d+)([GM])B?$", re.I)


def percentage(text: str | None) -> float | None:
    try:
        value = float(text or "")
    except ValueError:
        return None
    return value if 0.0 < value <= 100.0 else None


def limit_mb(text: str) -> int | None:
    """``35942M``, ``10G`` (the MPS guide's form)."""
    match = LIMIT.match(text.strip())
    if not match:
        return None
    return int(match[1]) * (1024 if match[2].upper() == "G" else 1)


def show_limit(mb: int) -> str:
    """Whole GiB, rounded down, from 1 GiB on (measured: 35,942M -> 35G, 71,885M -> 70G); else MiB."""
    return f"{mb // 1024}G" if mb >= 1024 else f"{mb}M"


def peer(sock: socket.socket) -> tuple[int, int]:
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


@dataclass
class Client:
    pid: int
    uid: int
    id: int
    sock: socket.socket
    namespace: str
    command: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tell(self, event: str) -> None:
        with self.lock:
            send(self.sock, {"event": event})


@dataclass
class Server:
    pid: int
    uid: int
    process: subprocess.Popen
    percentage: float
    limits: dict[int, int]  # device index -> MiB
    clients: dict[int, Client] = field(default_factory=dict)
    status: str = "ACTIVE"
    faulted: set[int] = field(default_factory=set)
    next_id: int = 1


class Daemon:
    def __init__(self, multiuser: bool, foreground: bool):
        self.multiuser, self.foreground = multiuser, foreground
        self.pipe, self.logs = Path(pipe_directory()), Path(log_directory())
        self.uid = os.getuid()
        self.pid = os.getpid()
        self.devices = cards.visible(cards.all_cards(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        # A daemon's own environment sets the defaults it starts with (the MPS guide, 4.2.5.1, 4.2.7, 4.2.8).
        self.default_percentage = percentage(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")) or 100.0
        self.default_limits = self._limits_of(os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""))
        priority = os.environ.get("CUDA_MPS_CLIENT_PRIORITY", "0")
        self.default_priority = int(priority) if priority in ("0", "1") else 0
        self.servers: dict[int, Server] = {}
        self.cond = threading.Condition(threading.RLock())
        self.quitting = False
        self.done = threading.Event()
        self.log_lock = threading.Lock()
        self.listeners: list[socket.socket] = []
        self.lock_fd: int | None = None

    # logs ------------------------------------------------------------------------------------------------

    def _write(self, name: str, who: str, pid: int, message: str) -> None:
        now = datetime.now()
        line = f"[{now:%Y-%m-%d %H:%M:%S}.{now.microsecond // 1000:03d} {who} {pid:5d}] {message}\n"
        with self.log_lock:
            if self.foreground:
                sys.stdout.write(line)
                sys.stdout.flush()
            with contextlib.suppress(OSError), open(self.logs / name, "a") as log:
                log.write(line)

    def log(self, message: str) -> None:
        """control.log, as run2's ``control_log_tail``: ``[2026-12-04 15:39:47.719 Control   823] ...``."""
        self._write("control.log", "Control", self.pid, message)

    def server_log(self, server: Server, message: str) -> None:
        self._write("server.log", "Server", server.pid, message)

    # devices and limits ----------------------------------------------------------------------------------

    def device(self, name: str) -> int | None:
        """A device ordinal or UUID (the MPS guide) among the daemon's devices."""
        if name.isdigit():
            return int(name) if int(name) < len(self.devices) else None
        for index, card in enumerate(self.devices):
            if card.uuid == name:
                return index
        return None

    def _limits_of(self, text: str) -> dict[int, int]:
        """``0=10G,GPU-...=512M`` (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``); entries that name no device or
        no size are ignored."""
        limits = {}
        for entry in text.split(","):
            name, _, size = entry.partition("=")
            index = self.device(name.strip())
            if index is None and name.strip().startswith("GPU-"):
                matches = [i for i, c in enumerate(self.devices) if c.uuid.startswith(name.strip())]
                index = matches[0] if len(matches) == 1 else None
            mb = limit_mb(size)
            if index is not None and mb is not None:
                limits[index] = mb
        return limits

    # start and stop -------------------------------------------------------------------------------------

    def serve(self, lock_fd: int, ready_fd: int | None) -> int:
        """Listens on the pipe directory until ``quit`` or SIGTERM. ``lock_fd`` holds ``control_lock``."""
        self.pid, self.lock_fd = os.getpid(), lock_fd
        with contextlib.suppress(OSError):
            self.logs.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, lambda *_: self.done.set())
        signal.signal(signal.SIGINT, lambda *_: self.done.set())
        cwd = os.getcwd()
        os.chdir(self.pipe)  # bound by name: a pipe path past 107 bytes still works
        try:
            for name, mode in (("control", 0o666), ("control_privileged", 0o755)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(name)
                os.chmod(name, mode)
                listener.listen(64)
                self.listeners.append(listener)
            if not os.path.exists("log"):
                os.mkfifo("log")
            os.chmod("log", 0o777)
            Path("nvidia-cuda-mps-control.pid").write_text(f"{self.pid}\n")
            os.chmod("nvidia-cuda-mps-control.pid", 0o666)
        finally:
            os.chdir(cwd)
        cards.register("daemons")
        self.log("Start")
        if ready_fd is not None:
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        selector = selectors.DefaultSelector()
        for listener, privileged in zip(self.listeners, (False, True), strict=True):
            selector.register(listener, selectors.EVENT_READ, privileged)
        while not self.done.is_set():
            for key, _ in selector.select(0.2):
                with contextlib.suppress(OSError):
                    conn, _ = key.fileobj.accept()
                    threading.Thread(target=self.connection, args=(conn, key.data), daemon=True).start()
        if not self.quitting:  # SIGTERM: no waiting for clients
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        with self.cond:
            self.quitting = True
            for server in list(self.servers.values()):
                self.stop_server(server)
        for listener in self.listeners:
            with contextlib.suppress(OSError):
                listener.close()
        for name in ("control", "control_privileged", "nvidia-cuda-mps-control.pid"):
            with contextlib.suppress(OSError):
                (self.pipe / name).unlink()
        cards.unregister("daemons")
        self.log("Exit")
        if self.lock_fd is not None:  # before quit's answer: a new daemon may start as soon as it returns
            os.close(self.lock_fd)
            self.lock_fd = None

    def spawn(self, uid: int) -> Server | None:
        """A server process for ``uid`` with the defaults of this moment; None if the cards refuse it a
        context (a compute mode, another process holding an exclusive card) or this daemon may not start
        a process as ``uid``."""
        if uid != os.geteuid() and os.geteuid() != 0:
            return None
        with contextlib.ExitStack() as locks:
            for card in self.devices:
                locks.enter_context(cards.card_lock(card))
                if cards.refuses_context(card, -1):
                    self.log(SERVER_FAILED)
                    return None
            try:
                gid = pwd.getpwuid(uid).pw_gid
            except KeyError:
                gid = uid
            as_user = {"user": uid, "group": gid, "extra_groups": []} if uid != os.geteuid() else {}
            try:
                process = subprocess.Popen(
                    ["nvidia-cuda-mps-server"],
                    executable=SERVER_PROGRAM,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    close_fds=True,
                    cwd="/",
                    **as_user,
                )
            except OSError as exc:
                self.log(f"{SERVER_FAILED}: {exc}")
                return None
            for card in self.devices:
                cards.hold(card, process.pid)
        server = Server(process.pid, uid, process, self.default_percentage, dict(self.default_limits))
        self.servers[server.pid] = server
        self.log(f"Starting new server {server.pid} for user {uid}")
        self.log(f"NEW SERVER {server.pid}: Ready")
        self.server_log(server, "Server has started")
        threading.Thread(target=self._reap, args=(server,), daemon=True).start()
        return server

    def _reap(self, server: Server) -> None:
        status = server.process.wait()
        with self.cond:
            if self.servers.get(server.pid) is server:  # died on its own
                self._forget(server, status)

    def stop_server(self, server: Server) -> None:
        with contextlib.suppress(OSError):
            server.process.stdin.close()
        try:
            status = server.process.wait(2)
        except subprocess.TimeoutExpired:
            server.process.kill()
            status = server.process.wait()
        self._forget(server, status)

    def _forget(self, server: Server, status: int) -> None:
        self.servers.pop(server.pid, None)
        for card in self.devices:
            cards.release(card, server.pid)
        for client in list(server.clients.values()):  # the server is gone under them
            with contextlib.suppress(OSError):
                client.sock.shutdown(socket.SHUT_RDWR)
        self.log(f"Server {server.pid} exited with status {status}")
        self.cond.notify_all()

    # connections -------------------------------------------------------------------------------------------

    def connection(self, conn: socket.socket, privileged: bool) -> None:
        try:
            self._connection(conn, privileged)
        except Exception as exc:  # a fake's own fault: in control.log, not lost in a thread
            self.log(f"fake daemon error: {type(exc).__name__}: {exc}")

    def _connection(self, conn: socket.socket, privileged: bool) -> None:
        with conn:
            pid, uid = peer(conn)
            self.log("Accepting connection...")
            if privileged and uid not in (0, self.uid):
                self.log("Unable to accept priviliged connection from other user")
                return
            with conn.makefile("rb") as lines:
                try:
                    hello = json.loads(lines.readline() or "{}")
                except ValueError:
                    hello = {}
                if hello.get("hello") == "ui":
                    self.ui(conn, lines, uid, privileged)
                elif hello.get("hello") == "client":
                    self.client(conn, lines, pid, uid, hello)
                else:
                    self.log("Unable to read new connection type information")

    def ui(self, conn: socket.socket, lines, uid: int, privileged: bool) -> None:
        self.log("NEW UI")
        for line in lines:
            try:
                command = json.loads(line)["command"]
            except (ValueError, KeyError):
                break
            self.log(f"Cmd:{command}")
            out = self.command(command, uid, privileged)
            closing = command.split()[0] == "quit" and out == ""
            for reply_line in out.splitlines():
                self.log(reply_line)
            if closing:
                send(conn, {"out": out, "closing": True, "status": 0})
                self.done.set()
                return
            if not send(conn, {"out": out}):
                break
        self.log("UI closed")

    def client(self, conn: socket.socket, lines, pid: int, uid: int, hello: dict) -> None:
        """A CUDA process asks for a server: the one of its uid (or the root one with -M), started if there
        is none; a server of another uid is replaced once it has no client left, the process waiting till
        then (the MPS guide: one user's server at a time, requests of others queued)."""
        waiting = False
        with self.cond:
            while True:
                if self.quitting:
                    send(conn, {"ok": False, "error": ERR_CONNECT})
                    return
                owner = 0 if self.multiuser else uid
                server = next((s for s in self.servers.values() if s.uid == owner), None)
                if server is None and self.servers and not self.multiuser:
                    other = next(iter(self.servers.values()))
                    if other.clients:
                        if not waiting:
                            self.log(
                                f"NEW CLIENT {pid} from user {uid}: Server is not ready, push client to pending list"
                            )
                            waiting = True
                        self.cond.wait(0.2)
                        if _closed(conn):
                            return
                        continue
                    self.stop_server(other)
                if server is None:
                    self.log(f"NEW CLIENT {pid} from user {uid}: Server is not ready, start a new server")
                    server = self.spawn(owner)
                    if server is None:
                        send(conn, {"ok": False, "error": ERR_CONNECT})
                        return
                elif not waiting:
                    self.log(f"NEW CLIENT {pid} from user {uid}: Server already exists")
                if server.status != "ACTIVE":
                    send(conn, {"ok": False, "error": ERR_NOT_READY})
                    return
                break
            card = self.devices[0] if self.devices else None
            asked = percentage(hello.get("thread_percentage"))
            given = min(server.percentage, asked) if asked else server.percentage
            limit = server.limits.get(0)
            own = self._limits_of(hello.get("memory_limit") or "").get(0)
            if own is not None:
                limit = own if limit is None else min(limit, own)
            client = Client(pid, uid, server.next_id, conn, _namespace(pid), _command(pid))
            server.next_id += 1
            server.clients[pid] = client
            self.server_log(server, f"New client {pid} connected")
            reply = {"ok": True, "server": server.pid, "thread_percentage": given}
            if card is not None:
                reply.update(device=card.uuid, memory_mb=card.memory_mb, sms=card.sms, memory_limit_mb=limit)
            with client.lock:
                send(conn, reply)
        for _ in lines:  # a client says nothing more; its connection closing is its exit
            pass
        with self.cond:
            server.clients.pop(pid, None)
            server.faulted.discard(pid)
            if server.status == "FAULT" and not server.faulted:
                server.status = "ACTIVE"
            self.server_log(server, f"Client {pid} disconnected")
            self.cond.notify_all()

    # commands --------------------------------------------------------------------------------------------

    def command(self, line: str, uid: int, privileged: bool) -> str:
        words = line.split()
        name, args = words[0], words[1:]
        handler = getattr(self, "do_" + name, None)
        if name in ("get_device_client_list", "device_query"):
            return NOT_MODELLED.format(command=name)
        if handler is None:
            return UNKNOWN.format(command=line.strip())
        with self.cond:
            return handler(args, uid, privileged)

    def _server(self, text: str) -> Server | str:
        if not text.isdigit():
            return NEEDS_PID
        return self.servers.get(int(text)) or NO_SERVER.format(pid=text)

    def _may_change(self, server: Server, uid: int, privileged: bool) -> bool:
        """A server's limits and clients: root (through either socket) and the server's own uid (runs 2,
        5, 6)."""
        return privileged or uid == 0 or uid == server.uid

    def do_get_server_list(self, args, uid, privileged):
        return "\n".join(str(pid) for pid in self.servers)

    def do_start_server(self, args, uid, privileged):
        if len(args) != 2 or args[0] != "-uid" or not args[1].isdigit():
            return NEEDS_UID
        if not privileged:
            return INSUFFICIENT.format(uid=uid)
        owner = 0 if self.multiuser else int(args[1])
        if any(s.uid == owner for s in self.servers.values()):
            return ""
        for other in list(self.servers.values()):
            if other.clients:
                return SERVER_BUSY.format(uid=owner, pid=other.pid, owner=other.uid)
            self.stop_server(other)
        return "" if self.spawn(owner) else SERVER_FAILED

    def do_quit(self, args, uid, privileged):
        if not privileged:
            return QUIT_REFUSED
        timeout = float(args[1]) if len(args) == 2 and args[0] == "-t" and args[1].isdigit() else None
        self.quitting = True
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(s.clients for s in self.servers.values()):
            if deadline is not None and time.monotonic() >= deadline:
                break
            self.cond.wait(0.2)
        self.shutdown()
        return ""

    def do_get_default_active_thread_percentage(self, args, uid, privileged):
        return f"{self.default_percentage:.1f}"

    def do_set_default_active_thread_percentage(self, args, uid, privileged):
        if not privileged:
            return INSUFFICIENT.format(uid=uid)
        value = percentage(args[0] if args else None)
        if value is None:
            return BAD_PERCENTAGE
        self.default_percentage = value
        return f"{value:.1f}"

    def do_get_active_thread_percentage(self, args, uid, privileged):
        server = self._server(args[0] if args else "")
        return server if isinstance(server, str) else f"{server.percentage:.1f}"

    def do_set_active_thread_percentage(self, args, uid, privileged):
        server = self._server(args[0] if args else "")
        if isinstance(server, str):
            return server
        if not self._may_change(server, uid, privileged):
            return INSUFFICIENT.format(uid=uid)
        value = percentage(args[1] if len(args) > 1 else None)
        if value is None:
            return BAD_PERCENTAGE
        server.percentage = value
        return f"{value:.1f}"

    def _limit(self, limits: dict[int, int], args: list[str], missing: str) -> str:
        """``<dev>``: the limit of ``limits`` for that device."""
        index = self.device(args[0]) if args else None
        if index is None:
            return BAD_DEVICE
        mb = limits.get(index)
        return missing if mb is None else show_limit(mb)

    def _limit_set(self, limits: dict[int, int], args: list[str]) -> str:
        """``<dev> <value>`` into ``limits``."""
        index = self.device(args[0]) if args else None
        if index is None:
            return BAD_DEVICE
        mb = limit_mb(args[1]) if len(args) > 1 else None
        if mb is None:
            return BAD_LIMIT.format(value=" ".join(args[1:]))
        limits[index] = mb
        return ""

    def do_get_default_device_pinned_mem_limit(self, args, uid, privileged):
        return self._limit(self.default_limits, args, NO_DEFAULT_LIMIT)

    def do_set_default_device_pinned_mem_limit(self, args, uid, privileged):
        if not privileged:
            return INSUFFICIENT.format(uid=uid)
        return self._limit_set(self.default_limits, args)

    def do_get_device_pinned_mem_limit(self, args, uid, privileged):
        server = self._server(args[0] if args else "")
        return server if isinstance(server, str) else self._limit(server.limits, args[1:], NO_LIMIT)

    def do_set_device_pinned_mem_limit(self, args, uid, privileged):
        server = self._server(args[0] if args else "")
        if isinstance(server, str):
            return server
        if not self._may_change(server, uid, privileged):
            return INSUFFICIENT.format(uid=uid)
        return self._limit_set(server.limits, args[1:])

    def do_terminate_client(self, args, uid, privileged):
        """The client's work ends (it sees cudaErrorMpsClientTerminated); every other client of the server
        sees a fatal fault, as measured (runs 1 and 2: XID 31, "an illegal memory access"), and the server is
        in FAULT, refusing new clients, until all of them have exited (the MPS guide)."""
        server = self._server(args[0] if args else "")
        if isinstance(server, str):
            return server
        if not self._may_change(server, uid, privileged):
            return INSUFFICIENT.format(uid=uid) + "\n" + TERMINATE_REFUSED_CODE
        victim = server.clients.get(int(args[1])) if len(args) > 1 and args[1].isdigit() else None
        if victim is None:
            return BAD_PROCESS.format(pid=args[1] if len(args) > 1 else "")
        server.status = "FAULT"
        server.faulted = set(server.clients)
        self.server_log(server, "Volta MPS: Server is handling a fatal GPU error.")
        for client in server.clients.values():
            self.server_log(server, f"Volta MPS: status of client {{{client.pid}, 1}} is INACTIVE")
            client.tell("terminated" if client is victim else "fault")
        return "0"

    def do_ps(self, args, uid, privileged):
        if not self.servers:
            return NO_SERVERS
        servers = list(self.servers.values())
        if len(args) == 2 and args[0] == "-p":
            server = self._server(args[1])
            if isinstance(server, str):
                return server
            servers = [server]
        rows = []
        for server in servers:
            for client in server.clients.values():
                device = self.devices[0].uuid[:22] if self.devices else ""
                rows.append(
                    f"{client.pid:<10}{client.id:<10}{server.pid:<15}{device:<26}{client.namespace:<15}{client.command}"
                )
        return "\n".join([PS_HEADER, *rows]) if rows else ""

    def do_get_server_status(self, args, uid, privileged):
        server = self._server(args[0] if args else "")
        return server if isinstance(server, str) else server.status

    def do_get_client_list(self, args, uid, privileged):
        server = self._server(args[0] if args else "")
        return server if isinstance(server, str) else "\n".join(str(pid) for pid in server.clients)

    def do_get_default_client_priority(self, args, uid, privileged):
        return str(self.default_priority)

    def do_set_default_client_priority(self, args, uid, privileged):
        if not privileged:
            return INSUFFICIENT.format(uid=uid)
        if not args or args[0] not in ("0", "1"):
            return BAD_PRIORITY
        self.default_priority = int(args[0])
        return ""


def _closed(conn: socket.socket) -> bool:
    readable, _, _ = select.select([conn], [], [], 0)
    if not readable:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _namespace(pid: int) -> str:
    """The inode of the client's PID namespace (``ps``'s NAMESPACE, as the MPS guide and run2 show)."""
    try:
        return str(os.stat(f"/proc/{pid}/ns/pid").st_ino)
    except OSError:
        return "0"


def _command(pid: int) -> str:
    """The first word of the client's command line (run2: ``/opt/torch/.venv/bin/python3``, the path
    the program was started by, not the interpreter it links to)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() or "?"
    except OSError:
        return "?"


# --- starting ---------------------------------------------------------------------------------------------


def start(multiuser: bool, foreground: bool) -> int:
    """``-d``: the parent returns once the daemon listens; ``-f``: the daemon runs here."""
    pipe = Path(pipe_directory())
    try:
        pipe.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(pipe / "control_lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        print(f"Cannot access CUDA_MPS_PIPE_DIRECTORY={pipe} ({exc.strerror})")
        return 1
    with contextlib.suppress(OSError):
        os.fchmod(lock_fd, 0o666)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(ALREADY_RUNNING)
        return 0
    if multiuser and os.geteuid() != 0:
        print(ROOT_ONLY_MULTIUSER)
        return 0
    daemon = Daemon(multiuser, foreground)
    if foreground:
        return daemon.serve(lock_fd, None)
    ready_read, ready_write = os.pipe()
    if os.fork() == 0:
        os.close(ready_read)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        try:
            status = daemon.serve(lock_fd, ready_write)
        except BaseException:
            status = 1
        os._exit(status)
    os.close(ready_write)
    os.close(lock_fd)
    os.read(ready_read, 1)  # the daemon listens, or it died
    return 0
