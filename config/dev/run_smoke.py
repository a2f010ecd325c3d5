"""`make run-smoke`: the whole `make run` stack (config/dev/run.sh) on SQLite, used as a user would, then stopped.

The suite runs on PostgreSQL; `make run`'s last two bugs were on SQLite. This starts run.sh itself — gunicorn,
the daphne processes, the scheduler worker with beat, a node agent on simulated GPUs, the catalog's image
builds, the demo users — isolated so that it runs beside a developer's own `make run` and beside other CI
smokes: its own SQLite file, Redis db, free ports, node name, deployment id (the label on its containers) and
folders (RUN_DIR, keys, agent state, volumes, shared storage, LXCFS), all in one temporary folder. Then, with
the demo user's API token: create an instance on half an A100 with the smallest catalog image that is ready,
wait for it to run, let it run a real minute (billing's one-minute minimum and per-second metering), stop it,
wait for the settlement the stop triggers, and check the list, the bill and the wallet.

Each step prints its seconds; the last line is ``run-smoke: ok in N s`` or ``run-smoke: FAILED at <step>``
(then the last lines of every log of the stack). Whatever happens, run.sh is stopped as Ctrl-C stops it,
then its containers, volumes, mounts and temporary folder are removed.

    bash config/dev/run_smoke.sh [--keep] [--image-timeout 900]
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import redis
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.ports import free_port  # noqa: E402  (the rule for a free port, shared with the tests and benches)

MINIMUM_S = 60  # billing.rating.MINIMUM_S: a run shorter than a minute is charged a minute
CENT = Decimal("0.01")
READY_BANNER = "GPU cloud is running:"
SMOKE_IMAGE = "gpucloud/python:3.11-bookworm"  # the smallest of the catalog's images (agent/framework_images.py)
LOG_LINES = 50


class StepFailed(Exception):
    pass


class Stopped(BaseException):
    """SIGTERM or SIGHUP: end the run as a failure, through the same clean-up."""


# --- pure helpers (tests/test_run_smoke.py) --------------------------------------------------------------
def expected_charge(per_hour: Decimal, seconds: float) -> Decimal:
    """What ``seconds`` of running cost at ``per_hour``: per second, at least a minute, to the cent."""
    exact = per_hour * Decimal(max(float(MINIMUM_S), seconds)) / 3600
    return exact.quantize(CENT, rounding=ROUND_HALF_UP)


def charge_tolerance(lines: int) -> Decimal:
    """Each charge line (one per clock hour a run touches) is rounded on its own: half a cent each, and a cent
    for the seconds between what the bill says and what it was computed from."""
    return CENT / 2 * max(1, lines) + CENT


def demo_token(text: str, username: str = "demo") -> str:
    """The API token ``load_demo`` printed for ``username`` (``user demo / demo-pass-123  API token <key>``)."""
    match = re.search(rf"^user {re.escape(username)} / \S+\s+API token (\S+)$", text, re.M)
    if not match:
        raise StepFailed(f"no API token for {username!r} in what load_demo printed")
    return match.group(1)


def results(page):
    """A list API's rows, paginated ({"results": [...]}) or not."""
    return page["results"] if isinstance(page, dict) else page


# --- the stack ---------------------------------------------------------------------------------------------
class Stack:
    """run.sh in a session of its own, with everything it writes under ``folder``."""

    def __init__(self, folder: Path, redis_url: str):
        self.folder = folder
        self.run_dir = folder / "var"
        self.port = free_port(pair=True)
        self.deployment = f"run-smoke-{secrets.token_hex(4)}"
        self.shared_mount = folder / "sharedfs" / "mnt"
        self.lxcfs = folder / "lxcfs"
        self.output = folder / "run.out"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("REGISTRY", "WEBSOCKET_URL"))}
        self.env |= {
            "DATABASE_URL": f"sqlite:///{folder / 'db.sqlite3'}",
            "REDIS_URL": redis_url,
            "PORT": str(self.port),
            "WS_PORT": str(self.port + 1),
            "RELAY_PORT": str(free_port()),
            "NODE_NAME": "run-smoke-node",
            "DEPLOYMENT_ID": self.deployment,
            "SECRET_KEY": f"run-smoke-{secrets.token_hex(24)}",
            "RUN_DIR": str(self.run_dir),
            "KEYS_DIR": str(folder / "keys"),
            "AGENT_STATE_DIR": str(folder / "agent"),
            "VOLUMES_DIR": str(folder / "volumes"),
            "STATIC_ROOT": str(folder / "static"),
            "SHARED_FS_META": f"sqlite3://{folder / 'sharedfs' / 'meta.db'}",
            "SHARED_FS_BUCKET": f"{folder / 'sharedfs' / 'data'}/",
            "SHARED_FS_MOUNT": str(self.shared_mount),
            "SHARED_FS_CACHE_DIR": str(folder / "sharedfs" / "cache"),
            "LXCFS_DIR": str(self.lxcfs),
            # Only the image it runs: stopped half way, the others' builds (minutes: PyTorch, TensorFlow) can
            # leave an mmdebstrap chroot behind in /tmp, /proc still mounted in it (seen once on Ctrl-C).
            "BUILD_IMAGES": SMOKE_IMAGE,
        }
        if not (os.path.exists("/dev/fuse") and os.geteuid() == 0):
            self.env["SHARED_FS_META"] = ""  # run.sh would say the same: the mount needs FUSE and root
        self.process: subprocess.Popen | None = None
        self.redis_url, self.redis, self.redis_claimed = redis_url, redis.Redis.from_url(redis_url), False
        self.url = f"http://127.0.0.1:{self.port}"

    def redis_claim(self) -> str:
        """The Redis db must be empty: the stack's queues carry no name of their own (a message a stopped run
        left for node.run-smoke-node would reach the next run's agent), so the db is emptied at the end."""
        keys = self.redis.dbsize()
        if keys:
            raise StepFailed(
                f"{self.redis_url} holds {keys} keys; the smoke needs a Redis db of its own, emptied after it: "
                "empty it (redis-cli -n <db> flushdb) or name another in RUN_SMOKE_REDIS_URL"
            )
        self.redis_claimed = True
        return f"{self.redis_url} (empty)"

    def start(self) -> None:
        self.run_dir.mkdir(parents=True)
        (self.folder / "sharedfs").mkdir()  # where SHARED_FS_META's SQLite file goes (juicefs makes the file only)
        with open(self.output, "wb") as out:
            self.process = subprocess.Popen(
                ["bash", "config/dev/run.sh"],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a terminal's Ctrl-C stops it
            )

    def started(self) -> bool:
        if self.process.poll() is not None:
            raise StepFailed(f"run.sh exited with {self.process.returncode} before the console answered")
        return READY_BANNER in self.output.read_text(errors="replace")

    def stop(self) -> list[str]:
        """Ctrl-C: SIGINT to run.sh's process group (its background processes ignore it, as in a terminal; its
        trap stops them). Whatever of the group outlives it is then terminated, and named."""
        notes = []
        if self.process is None:
            return notes
        group = self.process.pid
        if self.process.poll() is None:
            _signal_group(group, signal.SIGINT)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                notes.append("run.sh did not stop within 90 s of Ctrl-C: terminated")
                _signal_group(group, signal.SIGTERM)
                self.process.wait(timeout=30)
        # Ctrl-C reached the whole group: an image build's mmdebstrap removes its half-made root filesystem first.
        deadline = time.monotonic() + 60
        while _group_members(group) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _group_members(group)
        if left:
            notes.append(f"still running 60 s after run.sh stopped, terminated: {', '.join(left)}")
            _signal_group(group, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while _group_members(group) and time.monotonic() < deadline:
                time.sleep(0.5)
            _signal_group(group, signal.SIGKILL)
        return notes

    def remove(self) -> list[str]:
        """Its containers and volumes (by its deployment label), its mounts, then its folder."""
        notes = []
        label = f"label=gpucloud.deployment={self.deployment}"
        containers = _lines(["docker", "ps", "-aq", "--filter", label])
        if containers:
            subprocess.run(["docker", "rm", "-f", *containers], capture_output=True, timeout=120)
        volumes = _lines(["docker", "volume", "ls", "-q", "--filter", label])
        if volumes:
            subprocess.run(["docker", "volume", "rm", "-f", *volumes], capture_output=True, timeout=120)
        for point in _mounts_under(self.folder):
            juicefs = ROOT / ".venv" / "bin" / "juicefs"
            if point == str(self.shared_mount) and juicefs.exists():
                subprocess.run([str(juicefs), "umount", point], capture_output=True, timeout=60)
            if point in _mounts_under(self.folder):
                subprocess.run(["umount", point], capture_output=True, timeout=60)
        deadline = time.monotonic() + 10  # the detached LXCFS and JuiceFS clients end once unmounted
        while _processes_naming(str(self.folder)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in _processes_naming(str(self.folder)):
            notes.append(f"process {pid} ({_command(pid)[:80]}) still ran: terminated")
            _kill(pid)
        if self.redis_claimed:
            self.redis.flushdb()
        if _mounts_under(self.folder):
            notes.append(f"{self.folder} kept: still mounted there: {', '.join(_mounts_under(self.folder))}")
        else:
            shutil.rmtree(self.folder, ignore_errors=True)
        return notes

    def logs(self) -> str:
        files = [self.output, *sorted((self.run_dir / "log").glob("*.log")), Path(f"{self.shared_mount}.log")]
        parts = []
        for path in files:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-LOG_LINES:]
                parts.append(f"---- {path.name} (last {len(tail)} lines) ----\n" + "\n".join(tail))
        return "\n".join(parts)


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass


def _group_members(group: int) -> list[str]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(f"{entry.name} {_command(int(entry.name))[:60]}")
    return members


def _processes_naming(text: str) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and int(entry.name) != os.getpid() and text in _command(int(entry.name))
    ]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def _mounts_under(folder: Path) -> list[str]:
    prefix = str(folder).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4].encode().decode("unicode_escape") for line in mountinfo]
    return sorted({p for p in points if p.startswith(prefix)}, reverse=True)  # deepest first


def _lines(argv: list[str]) -> list[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return done.stdout.split()


# --- the user's side ---------------------------------------------------------------------------------------
class Smoke:
    def __init__(self, stack: Stack, image_timeout: float):
        self.stack = stack
        self.image_timeout = image_timeout
        self.http = requests.Session()
        # gunicorn closes a connection idle for its keep-alive (5 s), and a request sent on it at that moment gets
        # no answer ("Remote end closed connection without response"): a read is sent again, as the SDK does.
        again = Retry(total=2, connect=2, read=2, status=0, allowed_methods=frozenset({"GET"}), raise_on_status=False)
        self.http.mount("http://", HTTPAdapter(max_retries=again))
        self.http.trust_env = False  # a proxy in the environment must not stand between it and 127.0.0.1
        self.started = time.monotonic()
        self.step_name = "start"

    def step(self, name: str, action):
        self.step_name = name
        begun = time.monotonic()
        detail = action()
        print(f"run-smoke: {name:<12} {time.monotonic() - begun:6.1f} s  {detail or ''}", flush=True)
        return detail

    def api(self, method: str, path: str, expect=(200,), **kwargs):
        response = self.http.request(method, f"{self.stack.url}/api/v1/{path}", timeout=30, **kwargs)
        if response.status_code not in expect:
            raise StepFailed(f"{method} /api/v1/{path}: HTTP {response.status_code} {response.text[:300]}")
        return response.json()

    def wait(self, what: str, probe, timeout: float, every: float = 1.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            done, last = probe()
            if done:
                return last
            time.sleep(every)
        raise StepFailed(f"{what}: not within {timeout:.0f} s (last seen: {last})")

    # --- steps ---
    def console(self):
        self.stack.start()
        self.wait("run.sh's banner", lambda: (self.stack.started(), "starting"), timeout=300)

        def login():
            try:
                return self.http.get(f"{self.stack.url}/login/", timeout=10).status_code == 200, "no answer"
            except requests.ConnectionError as exc:
                return False, str(exc)[:200]

        self.wait("the console's sign-in page", login, timeout=30)
        users = self.stack.run_dir / "log" / "demo-users.txt"
        self.http.headers["Authorization"] = f"Token {demo_token(users.read_text())}"
        me = self.api("GET", "me/")
        if me.get("username") != "demo":
            raise StepFailed(f"the demo token is {me.get('username')!r}'s")
        return f"{self.stack.url} (deployment {self.stack.deployment}), signed in as demo"

    def image(self):
        """The catalog's smallest image, built by run.sh in the background, once ready."""

        def probe():
            images = results(self.api("GET", "images/"))
            wanted = next((i for i in images if i["docker_ref"] == SMOKE_IMAGE), None)
            if wanted is None:
                raise StepFailed(f"the catalog does not offer {SMOKE_IMAGE}: {[i['docker_ref'] for i in images]}")
            if wanted["status"] == "failed":
                raise StepFailed(f"{wanted['name']} failed to build: {wanted['status_reason']}")
            return wanted["status"] == "ready", wanted

        self.chosen_image = self.wait("a ready catalog image", probe, timeout=self.image_timeout, every=2)
        return f"{self.chosen_image['name']} ({self.chosen_image['docker_ref']})"

    def node(self, gpu_model: str):
        """The node agent registers its cards while the console already answers: wait until the GPU type
        shows them, as the console's create form does (before that a create is refused at gpu_type)."""

        def probe():
            gpu_type = next((t for t in results(self.api("GET", "gpu-types/")) if t["name"] == gpu_model), None)
            if gpu_type is None:
                raise StepFailed(f"the catalog has no GPU type {gpu_model}")
            return gpu_type["capacity"].get("cards", 0) > 0, gpu_type

        self.gpu_type = self.wait(f"{gpu_model} cards in the cluster", probe, timeout=120)
        capacity = self.gpu_type["capacity"]
        return f"{gpu_model}: {capacity['cards']} cards on {', '.join(capacity.get('nodes', {}))}"

    def command(self):
        """`python manage.py node list` typed in the checkout as the README shows it, with no settings of its own:
        it runs as the stack does, from run.sh's run.env (RUN_ENV_FILE: this stack's, not a developer's var/)."""
        typed = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TERM")}
        typed["RUN_ENV_FILE"] = str(self.stack.run_dir / "run.env")
        argv = [sys.executable, "manage.py", "node", "list"]
        done = subprocess.run(argv, cwd=ROOT, env=typed, capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or "run-smoke-node" not in done.stdout:
            raise StepFailed(f"manage.py node list: exit {done.returncode}: {(done.stderr or done.stdout)[-400:]}")
        return next(line for line in done.stdout.splitlines() if "run-smoke-node" in line)[:100]

    def create(self, gpu_model: str, gpus: str):
        gpu_type = self.gpu_type
        shape = {"gpu_type": gpu_type["id"], "gpus": gpus, "cpu_cores": 1, "memory_gb": 2}
        price = self.api("GET", "prices/", params=shape)
        self.per_hour = Decimal(price["on_demand_per_hour"])
        card_share = Decimal(gpu_type["price_per_hour"]) * Decimal(gpus)
        if abs(self.per_hour - card_share) > CENT:  # 1 core and 2 GB are within the card's allotment
            raise StepFailed(f"{gpus} of {gpu_model} costs {self.per_hour}/h, not {card_share}/h")
        self.balance_before = Decimal(self.api("GET", "billing/")["balance"])
        body = shape | {"image": self.chosen_image["id"], "disk_gb": 10, "name": "run-smoke"}
        headers = {"Idempotency-Key": secrets.token_hex(16)}
        self.instance = self.api("POST", "instances/", expect=(201,), json=body, headers=headers)
        self.created_at = datetime.now(UTC)
        what = f"{gpus} x {gpu_model} at {self.per_hour}/h"
        return f"instance {self.instance['id']}: {what}, balance {self.balance_before}"

    def status_is(self, wanted: str):
        def probe():
            instance = self.api("GET", f"instances/{self.instance['id']}/")
            seen = f"{instance['status']} ({instance['status_reason']})"
            if instance["status"] in ("failed", "released"):
                raise StepFailed(f"the instance is {seen}")
            return instance["status"] == wanted, instance

        return probe

    def running(self):
        instance = self.wait("RUNNING", self.status_is("running"), timeout=240)
        self.running_seen = time.monotonic()
        label = f"label=gpucloud.deployment={self.stack.deployment}"
        running = _lines(["docker", "ps", "-q", "--filter", label])
        if len(running) != 1:
            raise StepFailed(f"{len(running)} running containers carry {label}, not 1")
        return f"on {instance['node']}, container {instance['container_id'][:12]}"

    def run_a_minute(self):
        until = self.running_seen + MINIMUM_S
        while time.monotonic() < until:
            self.status_is("running")()[0] or _raise(StepFailed("it left RUNNING while it ran"))
            time.sleep(min(5.0, max(0.0, until - time.monotonic())))
        return f"{time.monotonic() - self.running_seen:.0f} s since RUNNING was seen"

    def stop(self):
        self.stop_asked = time.monotonic()
        self.api("POST", f"instances/{self.instance['id']}/stop/", expect=(200, 202))
        self.wait("STOPPED", self.status_is("stopped"), timeout=120)
        self.stopped_seen = time.monotonic()
        return f"stopped {self.stopped_seen - self.stop_asked:.1f} s after asking"

    def settle(self):
        """The stop sends the settlement (billing.receivers): the instance's line, and no usage left unsettled."""
        months = sorted({self.created_at.strftime("%Y-%m"), datetime.now(UTC).strftime("%Y-%m")})

        def probe():
            lines = [
                line
                for month in months
                for line in self.api("GET", "billing/statement/", params={"month": month})
                if line["name"] == self.instance["name"]
            ]
            account = self.api("GET", "billing/")
            done = bool(lines) and Decimal(account["unsettled"]) == 0
            return done, (lines, account)

        self.lines, self.account = self.wait("settlement", probe, timeout=120)
        return f"{len(self.lines)} statement line(s), unsettled {self.account['unsettled']}"

    def check(self):
        instances = results(self.api("GET", "instances/"))
        if [(i["id"], i["status"]) for i in instances] != [(self.instance["id"], "stopped")]:
            raise StepFailed(f"the list is {[(i['id'], i['status']) for i in instances]}, not one stopped instance")
        amount = sum((Decimal(line["amount"]) for line in self.lines), Decimal(0))
        seconds = sum(float(line["seconds"]) for line in self.lines)
        ran_at_most = self.stopped_seen - self.running_seen + 10  # its RUNNING began before it was seen
        if not MINIMUM_S <= seconds <= max(ran_at_most, MINIMUM_S + 1):
            raise StepFailed(f"billed {seconds:.1f} s; it ran {MINIMUM_S}-{ran_at_most:.0f} s")
        expected = expected_charge(self.per_hour, seconds)
        if amount <= 0 or abs(amount - expected) > charge_tolerance(len(self.lines)):
            raise StepFailed(f"charged {amount}; {seconds:.1f} s at {self.per_hour}/h is {expected}")
        balance = Decimal(self.account["balance"])
        if self.balance_before - balance != amount:
            raise StepFailed(f"the balance went {self.balance_before} -> {balance}, not down by the charge {amount}")
        return f"billed {seconds:.1f} s = {amount} (expected {expected}); balance {self.balance_before} -> {balance}"


def _raise(exc: Exception):
    raise exc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("RUN_SMOKE_REDIS_URL", "redis://127.0.0.1:6379/7"))
    parser.add_argument("--gpu", default="A100-80GB", help="a GPU type the simulated node has")
    parser.add_argument("--gpus", default="0.5", help="a fraction of one card")
    parser.add_argument(
        "--image-timeout", type=float, default=900, help="seconds to wait for the catalog image to be built"
    )
    parser.add_argument("--keep", action="store_true", help="leave the temporary folder (logs, database) in place")
    args = parser.parse_args()

    def stopped(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGHUP, stopped)
    os.chdir(ROOT)
    folder = Path(tempfile.mkdtemp(prefix="run-smoke-"))
    stack = Stack(folder, args.redis_url)
    smoke = Smoke(stack, args.image_timeout)
    failure = None
    try:
        smoke.step("redis", stack.redis_claim)
        smoke.step("console", smoke.console)
        smoke.step("image", smoke.image)
        smoke.step("node", lambda: smoke.node(args.gpu))
        smoke.step("command", smoke.command)
        smoke.step("create", lambda: smoke.create(args.gpu, args.gpus))
        smoke.step("running", smoke.running)
        smoke.step("run 60 s", smoke.run_a_minute)
        smoke.step("stop", smoke.stop)
        smoke.step("settle", smoke.settle)
        smoke.step("list + bill", smoke.check)
    except (Exception, KeyboardInterrupt, Stopped) as exc:
        failure = f"{type(exc).__name__}: {exc}" if not isinstance(exc, StepFailed) else str(exc)
        print(f"run-smoke: {smoke.step_name} failed: {failure}", flush=True)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C must not cut the clean-up
            signal.signal(signum, signal.SIG_IGN)
        begun = time.monotonic()
        notes = stack.stop()
        if failure or notes:  # after the stop: how each process ended is in its log too
            print(stack.logs(), flush=True)
        if args.keep:
            notes.append(f"kept {folder} (--keep): its containers too; remove with docker rm -f")
        else:
            notes += stack.remove()
        for note in notes:
            print(f"run-smoke: note: {note}", flush=True)
        print(f"run-smoke: {'teardown':<12} {time.monotonic() - begun:6.1f} s", flush=True)
    total = time.monotonic() - smoke.started
    if failure:
        print(f"run-smoke: FAILED at {smoke.step_name} after {total:.0f} s: {failure}", flush=True)
        return 1
    print(f"run-smoke: ok in {total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
