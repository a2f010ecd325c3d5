"""Fractions and GPU numbers on a real NVIDIA card, checked the way the node agent does them.

Runs as root on a bare GPU machine: no Docker, no database, no Django. Tenants are plain processes in
what a container gives them — their own PID, IPC and mount namespaces (``unshare``), the card's MPS pipe
seen read-only at the driver's default path ``/tmp/nvidia-mps``, a private ``/dev/shm`` — and the card's
daemon is started and configured by the agent's own code (``agent.mps``). ``bench/gpu_check.sh`` is the
way in; it picks the Python that has PyTorch. Prints one JSON line per step, then a summary with
``errors``; with ``OUT`` set, the lines also go to ``$OUT/gpu_check.jsonl``.

Steps (``GPU_CHECK_SECONDS``, 8 by default, is each busy loop's length):

1. ``card``: the card, its driver, its compute mode (restored at the end), the tools found.
2. ``alone``: one process, no MPS, the whole card: grabs memory 512 MiB at a time until refused, then a
   bf16 8192³ matmul loop: the card's rate. Meanwhile ``nvml``: the agent's NVML backend samples the card
   every second for ``GPU_CHECK_NVML_S`` (30): every field it read, and what a sample costs.
3. ``daemon``: ``agent.mps`` makes the card exclusive and starts its daemon for 0.5 shares; the control
   pipe's answers to the commands the agent uses.
4. ``views``: which container view of the pipe lets a client in: the whole pipe directory read-only, or
   the ``control`` socket alone; each with a private ``/dev/shm``.
5. ``pair``: two 0.5 tenants at once: memory each got against its cap, rate against the card alone, the
   SM count each was given; per-tenant compute as NVML reports it meanwhile (``per_tenant``).
6. ``small``: the card empty, its class changed to 0.25 by the agent's code; one 0.25 tenant alone.
7. ``environment``: two 0.25 tenants, one with ``CUDA_MPS_PIPE_DIRECTORY`` unset, one asking for 100 %
   and all the memory through its own ``CUDA_MPS_*`` variables.
8. ``two_processes``: tenant A starts two CUDA processes beside tenant B; the agent's own watch
   (``agent.mps_watch``) stops A's second one: how long the overuse lasted, whether the others ran on.
9. ``control_from_a_host_root_tenant``: from inside a tenant's view, as root on the host and as nobody,
   the control commands that would change limits, end another tenant or stop the daemon (reported: why
   fractions need a user-namespaced engine).
10. ``unprivileged``: the daemon multi-user, tenants as an unprivileged uid: the same commands, refused.
11. ``bypass``: the card as the agent leaves it (its server started), no client: a process pointed away
   from the pipe (``/nowhere``) must get no context.
12. ``restore``: the daemon quit and the card's compute mode as it was.

``GPU_CHECK_FOCUS=1`` runs only ``daemon`` and ``unprivileged`` (the questions a full run left open).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent import mps  # noqa: E402  (Django-free)

BUSY_S = float(os.environ.get("GPU_CHECK_SECONDS", "8"))
NVML_S = float(os.environ.get("GPU_CHECK_NVML_S", "30"))
GPU = os.environ.get("GPU_CHECK_GPU", "0")
PYTHON = os.environ.get("GPU_CHECK_PYTHON", sys.executable)
RESULTS: list[dict] = []
OUT = Path(os.environ["OUT"]) / "gpu_check.jsonl" if os.environ.get("OUT") else None

# A tenant's program. "grab": memory 512 MiB at a time until refused, then the busy loop; "busy": the loop
# alone; "ctx": a context and a small allocation only. Prints one JSON line.
WORK = r"""
import json, os, sys, time
mode, seconds = sys.argv[1], float(sys.argv[2])
out = {"pid": os.getpid()}
try:
    import torch
    torch.cuda.init()
    out["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = []
    if mode == "grab":
        while len(blocks) < 400:
            try:
                blocks.append(torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda"))
            except (RuntimeError, torch.OutOfMemoryError):
                break
        out["grabbed_mb"] = len(blocks) * 512
        blocks.clear(); torch.cuda.empty_cache()
    x = torch.ones(1, device="cuda"); torch.cuda.synchronize()
    out["context"] = True
    if mode in ("grab", "busy"):
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(3): a @ b
        torch.cuda.synchronize(); start, n = time.time(), 0
        print(json.dumps({"busy_from": start, "pid": os.getpid()}), flush=True)
        while time.time() - start < seconds:
            a @ b; n += 1
            if n % 10 == 0: torch.cuda.synchronize()
        torch.cuda.synchronize()
        out["iters_per_s"] = round(n / (time.time() - start), 1)
except Exception as exc:
    out["context"] = out.get("context", False)
    out["error"] = f"{type(exc).__name__}: {exc}"[:400]
print(json.dumps(out), flush=True)
"""


def emit(record: dict) -> None:
    RESULTS.append(record)
    line = json.dumps(record, default=str)
    print(line, flush=True)
    if OUT:
        with OUT.open("a") as f:
            f.write(line + "\n")


def step(name: str, fn, *args) -> dict:
    started = time.monotonic()
    try:
        record = {"step": name, **(fn(*args) or {})}
    except Exception as exc:  # one step's failure must not cost the others
        record = {"step": name, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-600:]}
    record["seconds"] = round(time.monotonic() - started, 1)
    emit(record)
    return record


def sh(command: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout, **kw)


def smi(query: str) -> str:
    return sh(f"nvidia-smi -i {GPU} --query-gpu={query} --format=csv,noheader,nounits").stdout.strip()


# --- tenants: a container's view without Docker -------------------------------------------------------


def sandbox(pipe: Path | None, *, view: str = "dir", env: dict | None = None, user: str = "") -> list[str]:
    """argv that runs a command as a container would: own PID, IPC and mount namespaces; the pipe (the
    whole directory, or its ``control`` socket alone) read-only at /tmp/nvidia-mps; a private /dev/shm."""
    mounts = ["mount -t tmpfs -o size=2g tmpfs /dev/shm"]
    if pipe is not None and view == "dir":
        mounts += [f"mount --bind {pipe} {mps.CLIENT_PIPE_PATH}", f"mount -o remount,bind,ro {mps.CLIENT_PIPE_PATH}"]
    elif pipe is not None and view == "socket":
        mounts += [
            f"mount -t tmpfs -o size=1m tmpfs {mps.CLIENT_PIPE_PATH}",
            f"touch {mps.CLIENT_PIPE_PATH}/control",
            f"mount --bind {pipe}/control {mps.CLIENT_PIPE_PATH}/control",
            f"mount -o remount,ro,bind {mps.CLIENT_PIPE_PATH}/control",
            f"mount -o remount,ro {mps.CLIENT_PIPE_PATH}",
        ]
    exports = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    prefix = f"setpriv --reuid={user} --regid={user} --clear-groups " if user else ""
    script = " && ".join(mounts) + f' && exec env {exports} {prefix}"$@"'
    return ["unshare", "--pid", "--ipc", "--mount", "--fork", "--mount-proc", "--propagation", "private",
            "sh", "-c", script, "tenant"]  # fmt: skip


def tenant_env(extra: dict | None = None, unset: tuple = ()) -> dict:
    env = {"CUDA_MPS_PIPE_DIRECTORY": mps.CLIENT_PIPE_PATH, **(extra or {})}
    for key in unset:
        env.pop(key, None)
    return env


def start(argv: list[str], mode: str, seconds: float = BUSY_S, env: dict | None = None) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_MPS_", "CUDA_VISIBLE"))}
    return subprocess.Popen(
        [*argv, PYTHON, "-c", WORK, mode, str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean, **(env or {})},
    )


def finish(process: subprocess.Popen, timeout: float = 300) -> dict:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        result = {"context": False, "error": (err or out).strip()[-400:] or f"exit {process.returncode}"}
    result.pop("busy_from", None)
    if process.returncode and "error" not in result:
        result["error"] = err.strip()[-300:] or f"exit {process.returncode}"
    return result


def run_tenants(specs: list[tuple[list[str], str, dict | None]], seconds: float = BUSY_S) -> list[dict]:
    processes = [start(argv, mode, seconds, env) for argv, mode, env in specs]
    return [finish(p) for p in processes]


# --- NVML: the agent's backend, and what it says of each process ----------------------------------------


class NvmlWatch(threading.Thread):
    """Samples the card every second: the agent's backend (every field, its cost) and NVML's per-process
    view (SM utilization per pid, memory per MPS client)."""

    def __init__(self, uuid: str, memory_mb: int, model: str):
        super().__init__(daemon=True)
        import pynvml

        self.nvml, self.uuid, self.stop_event = pynvml, uuid, threading.Event()
        self.samples: list[dict] = []
        self.backend_error = None
        try:
            from agent.telemetry.nvml import NvmlBackend
            from scheduler.telemetry.documents import Card

            self.card = Card(0, uuid, model, memory_mb)
            self.backend = NvmlBackend([self.card])
        except Exception as exc:  # the check goes on with plain NVML
            self.backend, self.backend_error = None, f"{type(exc).__name__}: {exc}"
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        self.last = 0

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            self.samples.append(self.sample())

    def sample(self) -> dict:
        n, record = self.nvml, {"t": time.time()}
        if self.backend is not None:
            started = time.perf_counter()
            try:
                readings, _ = self.backend.sample([self.card], [], {})
                record["backend"] = {k: v for k, v in vars(readings[0]).items() if k != "tenants"} if readings else None
            except Exception as exc:
                record["backend_error"] = f"{type(exc).__name__}: {exc}"
            record["backend_ms"] = round((time.perf_counter() - started) * 1000, 1)
        try:
            samples = n.nvmlDeviceGetProcessUtilization(self.handle, self.last)
            if samples:
                self.last = max(s.timeStamp for s in samples)
            record["sm_by_pid"] = {s.pid: s.smUtil for s in samples}
        except n.NVMLError as exc:
            record["sm_by_pid"] = {} if isinstance(exc, n.NVMLError_NotFound) else str(exc)
        for name, fn in (("mps_clients", "nvmlDeviceGetMPSComputeRunningProcesses"),
                         ("compute", "nvmlDeviceGetComputeRunningProcesses")):  # fmt: skip
            try:
                record[name] = {p.pid: (p.usedGpuMemory or 0) // 2**20 for p in getattr(n, fn)(self.handle)}
            except (n.NVMLError, AttributeError) as exc:
                record[name] = str(exc)
        try:
            record["card_util"] = n.nvmlDeviceGetUtilizationRates(self.handle).gpu
        except n.NVMLError:
            record["card_util"] = None
        return record

    def between(self, t0: float, t1: float) -> list[dict]:
        return [s for s in self.samples if t0 <= s["t"] <= t1]


def per_tenant(watch: NvmlWatch | None, t0: float, pids: list[int]) -> dict:
    """What NVML said of the tenants' pids (and of anything else) while they ran."""
    if watch is None:
        return {"error": "no NVML"}
    seen = watch.between(t0, time.time())
    sm = {}
    for s in seen:
        if isinstance(s.get("sm_by_pid"), dict):
            for pid, util in s["sm_by_pid"].items():
                sm.setdefault(str(pid), []).append(util)
    clients = {}
    for s in seen:
        if isinstance(s.get("mps_clients"), dict):
            for pid, mb in s["mps_clients"].items():
                clients[str(pid)] = max(clients.get(str(pid), 0), mb)
    return {
        "tenant_pids": pids,
        "sm_util_by_pid_max": {pid: max(v) for pid, v in sm.items()},
        "tenants_with_sm_reading": [p for p in map(str, pids) if p in sm],
        "mps_client_memory_mb": clients,
        "card_util_max": max((s["card_util"] for s in seen if s.get("card_util") is not None), default=None),
        "samples": len(seen),
    }


# --- the steps ----------------------------------------------------------------------------------------


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a timeout still restores the card (finally)
    if OUT:
        OUT.parent.mkdir(parents=True, exist_ok=True)
    facts = step("card", card_facts)
    if "uuid" not in facts:
        emit({"step": "summary", "errors": 1, "error": "no NVIDIA GPU here"})
        return 1
    uuid, memory_mb, mode_before = facts["uuid"], facts["memory_mb"], facts["compute_mode"]
    host = mps.MpsHost(
        Path(tempfile.mkdtemp(prefix="gpu-check-mps-", dir="/run" if os.access("/run", os.W_OK) else None))
    )
    card = host.card(uuid)
    os.makedirs(mps.CLIENT_PIPE_PATH, exist_ok=True)
    watch = None
    try:
        watch = NvmlWatch(uuid, memory_mb, facts["name"])
        watch.start()
    except Exception as exc:
        emit({"step": "nvml", "error": f"{type(exc).__name__}: {exc}"})
    checks: dict[str, bool] = {}
    try:
        if os.environ.get("GPU_CHECK_FOCUS"):  # the questions a full run left open, alone
            step("daemon", daemon_up, card, 250, memory_mb)
            plain = step("unprivileged", unprivileged_tenants, card, "socket", memory_mb)
            checks["unprivileged_tenant_cannot_change_limits"] = plain.get("limits_unchanged") is True
            checks["unprivileged_tenant_cannot_end_another"] = plain.get("holder_survived") is True
        else:
            full_run(card, watch, facts, checks)
    finally:
        restored = step("restore", restore, card, mode_before)
        checks["mode_restored"] = restored.get("compute_mode") == mode_before
        if watch is not None:
            watch.stop_event.set()
        shutil.rmtree(host.root, ignore_errors=True)
    errors = sum(1 for r in RESULTS if "error" in r) + sum(1 for ok in checks.values() if not ok)
    commit = sh(f"git -C {ROOT} rev-parse --short HEAD").stdout.strip() or os.environ.get("GPU_CHECK_COMMIT", "")
    emit({"step": "summary", "card": facts["name"], "driver": facts["driver"], "checks": checks,
          "errors": errors, "commit": commit})  # fmt: skip
    return 1 if errors else 0


def full_run(card: mps.Card, watch, facts: dict, checks: dict) -> None:
    memory_mb = facts["memory_mb"]
    t0 = time.time()

    alone = step("alone", lambda: run_tenants([([], "grab", None)])[0])
    rate = alone.get("iters_per_s")
    if watch is not None:
        wait = NVML_S - (time.time() - t0)
        if wait > 0:
            time.sleep(wait)
        step("nvml", nvml_summary, watch, t0)
    step("daemon", daemon_up, card, 500, memory_mb)
    views = step("views", views_probe, card)
    view = "socket" if views.get("socket", {}).get("context") else "dir"
    pair = step("pair", shares_run, card, watch, [500, 500], memory_mb, rate, view, None)
    tenants = pair.get("tenants", [])
    checks["pair_memory_within_2pct_of_cap"] = bool(tenants) and all(s.get("memory_within_2pct") for s in tenants)
    checks["pair_rate_040_060"] = all(0.40 <= (s.get("rate_vs_alone") or 0) <= 0.60 for s in pair.get("tenants", []))
    step("small_class", class_change, card, 250, memory_mb)
    step("small", shares_run, card, watch, [250], memory_mb, rate, view, None)
    env = step("environment", environment_run, card, watch, memory_mb, rate, view)
    checks["environment_cannot_raise"] = bool(env.get("held"))
    extra = step("two_processes", two_processes, card, watch, memory_mb, rate, view)
    checks["second_process_stopped_others_ran_on"] = bool(extra.get("stopped")) and extra.get("others_ran_on") is True
    # A tenant that is root on the host (no user namespace): reported, not a check (the README says why
    # fractions need userns-remap); the daemon's defaults and quit stay refused all the same.
    attacks = step("control_from_a_host_root_tenant", control_from_a_tenant, card, view)
    checks["host_root_tenant_cannot_quit_daemon"] = attacks.get("daemon_survived") is True
    if os.environ.get("GPU_CHECK_UNPRIVILEGED", "1") == "1":
        plain = step("unprivileged", unprivileged_tenants, card, view, memory_mb)
        checks["unprivileged_tenant_cannot_change_limits"] = plain.get("limits_unchanged") is True
        checks["unprivileged_tenant_cannot_end_another"] = plain.get("holder_survived") is True
    bypass = step("bypass", bypass_run, card, memory_mb)
    checks["bypass_refused"] = bypass.get("refused") is True


def card_facts() -> dict:
    fields = smi("name,uuid,memory.total,driver_version,compute_mode,mig.mode.current")
    if not fields:
        raise RuntimeError("nvidia-smi found no card")
    name, uuid, memory, driver, mode, mig = [f.strip() for f in fields.split(",")]
    usage = sh("nvidia-cuda-mps-control -h 2>&1").stdout.strip()
    docker = shutil.which("docker") is not None and sh("docker info", timeout=20).returncode == 0
    return {
        "name": name, "uuid": uuid, "memory_mb": int(memory), "driver": driver, "compute_mode": mode,
        "mig": mig, "cuda": sh("nvidia-smi | grep -o 'CUDA Version: [0-9.]*'").stdout.strip(),
        "mps_control_usage": usage[-4000:], "docker": docker,
        "toolkit": sh("nvidia-ctk --version 2>&1 | head -1").stdout.strip() or None,
        "python": sys.version.split()[0],
        "torch": sh(f"{PYTHON} -c 'import torch; print(torch.__version__)'").stdout.strip(),
        "unshare": shutil.which("unshare"), "setpriv": shutil.which("setpriv"),
    }  # fmt: skip


def nvml_summary(watch: NvmlWatch, t0: float) -> dict:
    seen = watch.between(t0, time.time())
    costs = sorted(s["backend_ms"] for s in seen if "backend_ms" in s)
    backend = [s["backend"] for s in seen if s.get("backend")]
    fields = sorted({k for b in backend for k, v in b.items() if v is not None})
    missing = sorted({k for b in backend for k, v in b.items() if v is None} - set(fields))
    return {
        "samples": len(seen), "backend_error": watch.backend_error,
        "sample_ms_p50": costs[len(costs) // 2] if costs else None, "sample_ms_max": costs[-1] if costs else None,
        "fields_read": fields, "fields_never_read": missing, "last": backend[-1] if backend else None,
    }  # fmt: skip


def daemon_up(card: mps.Card, milli: int, memory_mb: int) -> dict:
    card.ensure(milli, memory_mb)
    answers = {c: raw(card, c) for c in ("get_server_list", "ps", "get_default_active_thread_percentage",
                                          "get_default_device_pinned_mem_limit 0", "no_such_command")}  # fmt: skip
    return {
        "answers": card.answers(),
        "class": card.configured_class(),
        "compute_mode": smi("compute_mode"),
        "limits": vars(mps.Limits.of(milli, memory_mb)),
        "pipe": sorted(p.name for p in card.pipe.iterdir()),
        "raw": answers,
    }


def raw(card: mps.Card, command: str) -> dict:
    result = card._run([card.host.control], stdin=command + "\n", timeout=20)
    return {"rc": result.returncode, "out": (result.stdout + result.stderr).strip()[:500]}


def views_probe(card: mps.Card) -> dict:
    """A tenant holds the card's server first, so a view that does not reach the daemon shows as no
    context (the card is exclusive), not as a plain context on the whole card."""
    holder = start(sandbox(card.pipe, view="dir"), "busy", BUSY_S, tenant_env())
    time.sleep(6)
    specs = [(sandbox(card.pipe, view=v), "ctx", tenant_env()) for v in ("dir", "socket")]
    dir_view, socket_view = run_tenants(specs, seconds=1)
    return {"dir": dir_view, "socket": socket_view, "holder": finish(holder), "servers": card.servers()}


def shares_run(card, watch, sizes, memory_mb, rate, view, env) -> dict:
    t0 = time.time()
    specs = [(sandbox(card.pipe, view=view), "grab", tenant_env(env)) for _ in sizes]
    results = run_tenants(specs)
    tenants = []
    for milli, got in zip(sizes, results, strict=True):
        cap = memory_mb * milli // 1000
        grabbed = got.get("grabbed_mb")
        tenants.append({
            "share": milli / 1000, **got, "memory_cap_mb": cap,
            "memory_within_2pct": grabbed is not None and abs(grabbed - cap) <= cap * 0.02,
            "rate_vs_alone": round(got["iters_per_s"] / rate, 3) if rate and got.get("iters_per_s") else None,
        })  # fmt: skip
    return {"view": view, "tenants": tenants, "per_tenant": per_tenant(watch, t0, [t.get("pid") for t in tenants])}


def class_change(card: mps.Card, milli: int, memory_mb: int) -> dict:
    before = card.configured_class()
    card.ensure(milli, memory_mb)
    return {"from": before, "to": card.configured_class(), "answers": card.answers()}


def environment_run(card, watch, memory_mb, rate, view) -> dict:
    raised = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory_mb}M"}
    t0 = time.time()
    specs = [
        (sandbox(card.pipe, view=view), "grab", tenant_env(unset=("CUDA_MPS_PIPE_DIRECTORY",))),
        (sandbox(card.pipe, view=view), "grab", tenant_env(raised)),
    ]
    unset, asked = run_tenants(specs)
    cap = memory_mb * 250 // 1000
    held = all(r.get("context") and (r.get("grabbed_mb") or 0) <= cap * 1.02 for r in (unset, asked))
    for r in (unset, asked):
        r["rate_vs_alone"] = round(r["iters_per_s"] / rate, 3) if rate and r.get("iters_per_s") else None
    return {"cap_mb": cap, "unset_pipe_variable": unset, "raised_limits": asked, "held": held,
            "per_tenant": per_tenant(watch, t0, [unset.get("pid"), asked.get("pid")])}  # fmt: skip


def two_processes(card, watch, memory_mb, rate, view) -> dict:
    """Tenant A starts two CUDA processes (its own PID namespace: one container), tenant B one. The agent's
    own watch (``agent.mps_watch``, a container told by its PID namespace here) stops A's second process;
    how long the overuse lasted, and whether A's first and B ran on."""
    from agent.mps_watch import MpsWatch

    program = f'{PYTHON} -c "$WORK" busy {BUSY_S * 2}'
    both = f"for i in 1 2; do {program} > /tmp/gc_$i.json 2>&1 & done; wait; cat /tmp/gc_*.json"
    argv = [*sandbox(card.pipe, view=view, env=tenant_env()), "sh", "-c", both]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    a = subprocess.Popen(argv, text=True, env={**os.environ, "WORK": WORK}, **pipes)
    b = start(sandbox(card.pipe, view=view), "busy", BUSY_S * 2, tenant_env())
    namespace = {}

    def container_of(pid: int) -> str | None:
        try:
            return namespace.setdefault(pid, os.readlink(f"/proc/{pid}/ns/pid"))
        except OSError:
            return None

    agent_watch = MpsWatch(card.host, container_of=container_of)
    deadline, clients, seen_at = time.monotonic() + 60, [], None
    while time.monotonic() < deadline:
        clients = card.clients()
        if len(clients) >= 3 and seen_at is None:
            seen_at = time.monotonic()
        stopped = agent_watch.step()
        if stopped:
            break
        time.sleep(0.2)
    result = {"clients_seen": [vars(c) for c in clients], "stopped": [vars(c) for c in stopped]}
    if stopped and seen_at is not None:
        result["overuse_s"] = round(time.monotonic() - seen_at, 2)
    out, err = a.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.startswith("{") and "busy_from" not in line]
    result["tenant_a"] = [json.loads(line) for line in lines]
    result["tenant_b"] = finish(b)
    result["others_ran_on"] = "error" not in result["tenant_b"] and any("error" not in r for r in result["tenant_a"])
    return result


def control_from_a_tenant(card: mps.Card, view: str) -> dict:
    """With another tenant's client on the card, a tenant (root, then nobody) sends the commands that
    would change limits, end that client or stop the daemon, through its own view of the pipe."""
    holder = start(sandbox(card.pipe, view=view), "busy", BUSY_S * 4, tenant_env())
    deadline, clients = time.monotonic() + 60, []
    while time.monotonic() < deadline and not clients:
        time.sleep(1)
        clients = card.clients()
    default = raw(card, "get_default_active_thread_percentage")["out"]
    attempts = ["get_server_list", "ps", "set_default_active_thread_percentage 100",
                "set_default_device_pinned_mem_limit 0 200G"]  # fmt: skip
    server = clients[0].server if clients else 0
    if clients:
        attempts += [
            f"set_active_thread_percentage {server} 100",
            f"set_device_pinned_mem_limit {server} 0 200G",
            f"terminate_client {server} {clients[0].pid}",
        ]
    attempts.append("quit")
    percentage = raw(card, f"get_active_thread_percentage {server}")["out"]
    said = {}
    for who, user in (("root", ""), ("nobody", "65534")):
        for command in attempts:
            argv = sandbox(card.pipe, view=view, env=tenant_env(), user=user)
            result = subprocess.run(
                [*argv, "nvidia-cuda-mps-control"], input=command + "\n", capture_output=True, text=True, timeout=30
            )
            entry = {"rc": result.returncode, "out": (result.stdout + result.stderr).strip()[:300]}
            if not card.answers():
                entry["daemon_quit"] = True
            now = raw(card, "get_default_active_thread_percentage")["out"]
            if now != default:
                entry["default_changed_to"] = now
            server_now = raw(card, f"get_active_thread_percentage {server}")["out"]
            if server_now != percentage:
                entry["server_changed_to"] = server_now
            said[f"{who}/{view}/{command}"] = entry
    log = card.logs / "control.log"
    result = finish(holder)
    return {
        "view": view,
        "said": said,
        "holder": result,
        "limits_unchanged": not any("default_changed_to" in v or "server_changed_to" in v for v in said.values()),
        "daemon_survived": not any(v.get("daemon_quit") for v in said.values()),
        "other_tenant_survived": "error" not in result,
        "control_log_tail": log.read_text()[-2000:] if log.exists() else "",
    }


def unprivileged_tenants(card: mps.Card, view: str, memory_mb: int) -> dict:
    """Tenants that are not root on the host (what a user-namespaced container is): the card's server then
    runs as their uid. One holds a client; another of the same uid tries to raise the server's limits,
    end that client, stop the daemon."""
    card.stop()
    card = mps.MpsHost(card.host.root, multiuser=True).card(card.uuid)  # one root-owned server for every uid
    card.ensure(250, memory_mb)
    uid, env = "65534", tenant_env({"HOME": "/tmp"})
    os.chmod(card.host.root, 0o755)
    os.chmod(card.base, 0o755)
    eager = raw(card, "start_server -uid 0")  # the agent starts the card's server before any tenant
    holder = start(sandbox(card.pipe, view=view, user=uid), "busy", BUSY_S * 3, env)
    deadline, clients = time.monotonic() + 60, []
    while time.monotonic() < deadline and not clients:
        time.sleep(1)
        clients = card.clients()
    if not clients:
        return {"holder": finish(holder), "error": "no client as uid 65534"}
    server = clients[0].server
    owner = sh(f"stat -c %u /proc/{server}").stdout.strip()
    before = raw(card, f"get_active_thread_percentage {server}")["out"]
    said = {}
    for command in (f"set_active_thread_percentage {server} 100", f"set_device_pinned_mem_limit {server} 0 200G",
                    f"terminate_client {server} {clients[0].pid}", "quit"):  # fmt: skip
        argv = sandbox(card.pipe, view=view, env=env, user=uid)
        result = subprocess.run([*argv, "nvidia-cuda-mps-control"], input=command + "\n", capture_output=True,
                                text=True, timeout=30)  # fmt: skip
        said[command] = {"out": (result.stdout + result.stderr).strip()[:300], "answers": card.answers(),
                         "server_percentage": raw(card, f"get_active_thread_percentage {server}")["out"]}  # fmt: skip
    got = finish(holder)
    card.stop()
    return {"multiuser": True, "start_server": eager, "server_uid": owner, "before": before,
            "said": said, "holder": got,
            "limits_unchanged": all(v["server_percentage"] == before for v in said.values()),
            "holder_survived": "error" not in got, "daemon_survived": card.answers()}  # fmt: skip


def bypass_run(card: mps.Card, memory_mb: int) -> dict:
    """The card as the agent leaves it for tenants (its server started before any of them), no client
    connected: a process pointed away from the pipe must get no context."""
    card.ensure(250, memory_mb)
    got = run_tenants([(sandbox(None), "ctx", {"CUDA_MPS_PIPE_DIRECTORY": "/nowhere"})], seconds=1)[0]
    return {"result": got, "servers": card.servers(), "refused": not got.get("context")}


def restore(card: mps.Card, mode_before: str) -> dict:
    card.stop()
    target = mps.EXCLUSIVE if mode_before.lower().startswith("exclusive") else mps.DEFAULT
    card.compute_mode(target)
    try:
        os.rmdir(mps.CLIENT_PIPE_PATH)  # made for the tenants' views; left if something else is there
    except OSError:
        pass
    return {"compute_mode": smi("compute_mode"), "daemon": card.answers()}


if __name__ == "__main__":
    sys.exit(main())
