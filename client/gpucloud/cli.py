"""gpucloud: jobs, instances, logs, shells and files on the GPU cloud, from the command line.

Exit codes: 0 done; 1 the API refused (or could not be reached); 2 a usage mistake;
3 not found; 4 not signed in (no or a bad token); ``submit`` (following), ``logs -f`` of a
job and ``exec`` exit with the job's / the shell's own exit code.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpucloud import config
from gpucloud.client import Client, LogsUnavailable
from gpucloud.errors import EXIT_API, EXIT_USAGE, ApiError, GpuCloudError
from gpucloud.models import Job, LogEnd, LogLine
from gpucloud.terminal import terminal_session

app = typer.Typer(
    help=__doc__.split("\n\n")[0] + "\n\nExit codes: 0 ok, 1 API error, 2 usage, 3 not found, 4 auth; "
    "following a job (submit, logs -f) or a shell (exec): its exit code.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
out = Console()
err = Console(stderr=True)
state: dict = {"profile": None}

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output (JSON).")]


@app.callback()
def main_options(
    profile: Annotated[str | None, typer.Option("--profile", "-p", help="A saved profile (see `login`).")] = None,
):
    state["profile"] = profile


def client() -> Client:
    return Client(profile=state["profile"])


def emit_json(data) -> None:
    out.file.write(json.dumps(data, indent=2, default=str) + "\n")


class Ref:
    """A reference on the command line: ``12`` or ``j12`` a job, ``i7`` an instance, ``a3`` an array."""

    PREFIXES = {"j": "job", "job": "job", "i": "instance", "inst": "instance", "instance": "instance", "a": "array"}

    def __init__(self, text: str, *, default: str = "job"):
        head = text.rstrip("0123456789").rstrip("/-:").lower()
        number = text[len(text.rstrip("0123456789")) :]
        if not number or (head and head not in self.PREFIXES):
            raise typer.BadParameter(f"{text!r}: give a job (12, j12), an instance (i7) or an array (a3)")
        self.kind, self.id = self.PREFIXES.get(head, default), int(number)

    def __str__(self) -> str:
        return f"{self.kind[0]}{self.id}"


def want(ref: Ref, *kinds: str) -> Ref:
    if ref.kind not in kinds:
        raise typer.BadParameter(f"{ref} is a {ref.kind}; this takes a {' or '.join(kinds)}")
    return ref


def memory_gb(text: str | None) -> int | None:
    """ "8G", "8GB", "8" -> 8; "512M" -> 1 (whole GB, at least 1)."""
    if text is None:
        return None
    value = text.strip().upper().removesuffix("B")
    try:
        if value.endswith("M"):
            return max(1, -(-int(value[:-1]) // 1024))
        return int(Decimal(value.removesuffix("G")))
    except (ValueError, InvalidOperation):
        raise typer.BadParameter(f"{text!r}: a size such as 8G") from None


def key_values(items: list[str] | None, what: str) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: {what} is KEY=VALUE")
        pairs[key] = value
    return pairs


# -- account ------------------------------------------------------------------------------------------


@app.command()
def login(
    url: Annotated[str | None, typer.Option(help="The platform's address, e.g. https://gpu.example.com")] = None,
    token: Annotated[str | None, typer.Option(help="An API token (console: Account → API token).")] = None,
    username: Annotated[str | None, typer.Option("--username", "-u", help="Get the token with your password.")] = None,
    password: Annotated[str | None, typer.Option(help="With --username (asked for when missing).")] = None,
    profile: Annotated[str | None, typer.Option(help="Save as this profile (default: the current one).")] = None,
):
    """Save the URL and API token (~/.config/gpucloud/config.toml, mode 600) and check them."""
    name = profile or state["profile"] or config.DEFAULT_PROFILE
    url = url or typer.prompt("URL", default="http://127.0.0.1:8000")
    if token is None and username:
        password = password or typer.prompt("Password", hide_input=True)
        token = Client.token_for(url, username, password)
    token = token or typer.prompt("API token", hide_input=True)
    me = Client(url=url, token=token).me()
    profile_ = config.Profile(name=name, url=url.rstrip("/"), token=token, ws_url=me.get("websocket_url") or "")
    path = config.profile_save(profile_, make_default=True)
    err.print(f"Signed in to {url} as {me['username']} (profile {name}, saved in {path}).")


@app.command()
def whoami(as_json: JsonFlag = False):
    """Who the saved token belongs to."""
    me = client().me()
    emit_json(me) if as_json else out.print(me["username"])


@app.command()
def balance(as_json: JsonFlag = False):
    """Your wallet: balance, unsettled usage, this month's spend."""
    account = client().balance()
    if as_json:
        return emit_json(account.raw)
    out.print(
        f"balance {account.balance} {account.currency}  available {account.available}  "
        f"unsettled {account.unsettled}  this month {account.month_spend}"
        + (f"  budget {account.monthly_budget}" if account.monthly_budget else "")
    )


@app.command()
def usage(
    month: Annotated[str | None, typer.Option(help="YYYY-MM (default: this month).")] = None, as_json: JsonFlag = False
):
    """This month's statement: one line per instance or job."""
    lines = client().statement(month)
    if as_json:
        return emit_json([line.raw for line in lines])
    table = Table("name", "kind", "gpu", "share", "mode", "hours", "amount")
    for line in lines:
        table.add_row(
            line.name, line.kind, line.gpu_model, f"{line.share:g}", line.billing_mode,
            f"{line.seconds / 3600:.2f}", line.amount,
        )  # fmt: skip
    out.print(table)
    out.print(f"total {sum((Decimal(line.amount) for line in lines), Decimal(0))}")


# -- catalog ------------------------------------------------------------------------------------------


@app.command()
def offers(
    gpu_type: Annotated[str | None, typer.Option(help="Only this GPU type (e.g. RTX3090).")] = None,
    min_memory: Annotated[str | None, typer.Option(help="At least this much GPU memory (e.g. 24G).")] = None,
    max_price: Annotated[
        float | None, typer.Option(help="At most this price per card-hour (spot with --spot).")
    ] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Compare spot prices (with --max-price).")] = False,
    available: Annotated[bool, typer.Option(help="Only types with a free card.")] = False,
    as_json: JsonFlag = False,
):
    """The GPU market: types, free cards, on-demand and spot prices per card-hour."""
    types = client().gpu_types()
    least = memory_gb(min_memory) or 0
    wanted = gpu_type and gpu_type.replace(" ", "").lower()
    types = [
        t for t in types
        if (not wanted or wanted in (t.name.lower(), t.display_name.replace(" ", "").lower()))
        and t.memory_gb >= least
        and (max_price is None or _price(t, spot) <= Decimal(str(max_price)))
        and (not available or t.free_cards > 0)
    ]  # fmt: skip
    if as_json:
        return emit_json([t.raw for t in types])
    table = Table("type", "memory", "free cards", "cards", "on-demand/h", "spot/h")
    for t in types:
        table.add_row(
            t.name, f"{t.memory_gb} GB", str(t.free_cards), str(t.capacity.get("cards", 0)),
            f"{t.price_per_hour} {t.currency}", f"{t.spot_price or '-'}",
        )  # fmt: skip
    out.print(table)


def _price(gpu_type, spot: bool) -> Decimal:
    return Decimal((gpu_type.spot_price if spot else None) or gpu_type.price_per_hour)


@app.command()
def images(
    mine: Annotated[bool, typer.Option(help="Your saved images, in every state.")] = False, as_json: JsonFlag = False
):
    """Images to run: the catalog's and your saved ones."""
    found = client().images(mine=mine)
    if as_json:
        return emit_json([i.raw for i in found])
    table = Table("id", "name", "framework", "status", "reference")
    for image in found:
        table.add_row(
            str(image.id), image.name, f"{image.framework} {image.framework_version}", image.status, image.docker_ref
        )
    out.print(table)


# -- work ---------------------------------------------------------------------------------------------

Command = Annotated[list[str] | None, typer.Argument(help="The command (after --), e.g. -- python train.py")]
GpuTypeOpt = Annotated[str, typer.Option(help="GPU type, e.g. RTX3090 (see `offers`).")]
GpusOpt = Annotated[
    str, typer.Option(help="Cards: 1, 2, ... or a share of one card of a size on offer (`offers --json`: share_sizes).")
]
ImageOpt = Annotated[str, typer.Option(help="Image: a name, id or framework (pytorch).")]
MemoryOpt = Annotated[str | None, typer.Option(help="Host memory, e.g. 8G.")]
CpusOpt = Annotated[int | None, typer.Option(help="CPU cores.")]


def elastic_range(text: str | None) -> tuple[int, int] | None:
    """--elastic MIN:MAX as (MIN, MAX)."""
    if text is None:
        return None
    low, colon, high = text.partition(":")
    if not (colon and low.strip().isdigit() and high.strip().isdigit()):
        raise typer.BadParameter(f"{text!r}: give MIN:MAX whole cards, e.g. 2:8", param_hint="--elastic")
    return int(low), int(high)


@app.command(context_settings={"allow_interspersed_args": False})
def submit(
    command: Command = None,
    gpu_type: GpuTypeOpt = ...,
    gpus: GpusOpt = "1",
    image: ImageOpt = "pytorch",
    memory: MemoryOpt = None,
    cpus: CpusOpt = None,
    name: Annotated[str | None, typer.Option(help="A name for the job.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE (repeat).")] = None,
    spot: Annotated[bool | None, typer.Option("--spot/--on-demand", help="Spot capacity (cheaper, evictable).")] = None,
    upload: Annotated[
        Path | None, typer.Option(help="A folder sent with the job (once for an array); the command runs in it.")
    ] = None,
    array: Annotated[str | None, typer.Option(help="A job array: 0-31%4 (indices, at most 4 at once).")] = None,
    param: Annotated[list[str] | None, typer.Option(help="A sweep: lr=1e-3,3e-4 (repeat: the product).")] = None,
    max_running: Annotated[int | None, typer.Option(help="Array: tasks running at once.")] = None,
    fallback: Annotated[str | None, typer.Option(help="Array: none | on-demand.")] = None,
    budget: Annotated[str | None, typer.Option(help="Array: stop it past this cost.")] = None,
    priority: Annotated[str | None, typer.Option(help="high | normal | low")] = None,
    max_runtime: Annotated[int | None, typer.Option(help="Seconds before it is stopped.")] = None,
    elastic: Annotated[
        str | None,
        typer.Option(
            help="An elastic job: MIN:MAX whole cards around --gpus; the scheduler grows it into idle cards and "
            "shrinks it when queued work needs them (each resize restarts it from its checkpoint)."
        ),
    ] = None,
    team: Annotated[str | None, typer.Option(help="Charge this team's wallet (its slug).")] = None,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Print the job's id and return.")] = False,
    as_json: JsonFlag = False,
):
    """Submit a batch job (or a job array / sweep); follow its logs to its end and exit with its exit code."""
    if not command:
        raise typer.BadParameter("give the command after --, e.g. -- python train.py", param_hint="COMMAND")
    text = " ".join(_quote(part) for part in command)
    api = client()
    common = dict(
        command=text, image=image, gpu_type=gpu_type, gpus=gpus, memory_gb=memory_gb(memory), cpu_cores=cpus,
        name=name, env=key_values(env, "--env") or None, spot=spot, team=team,
    )  # fmt: skip
    if (array or param) and elastic:
        raise typer.BadParameter("an array's tasks are not elastic: leave --elastic out", param_hint="--elastic")
    if array or param:
        params = {k: v.split(",") for k, v in key_values(param, "--param").items()} or None
        submitted = api.submit_array(
            **common, array=array, params=params, max_running=max_running, fallback=fallback, budget=budget,
            upload=upload,
        )  # fmt: skip
        if as_json:
            return emit_json(submitted.raw)
        err.print(f"array a{submitted.id}: {submitted.total} tasks ({'spot' if submitted.spot else 'on-demand'})")
        out.print(f"a{submitted.id}")
        return
    job = api.submit_job(
        **common, priority=priority, max_runtime_s=max_runtime, upload=upload, elastic=elastic_range(elastic)
    )
    if as_json and detach:
        return emit_json(job.raw)
    if detach:
        out.print(job.id)
        return
    err.print(f"job {job.id} {job.status}" + (f" ({job.status_reason})" if job.status_reason else ""))
    raise typer.Exit(_follow(api, "job", job.id, tail=None, since=None))


@app.command()
def run(
    gpu_type: GpuTypeOpt = ...,
    gpus: GpusOpt = "1",
    image: ImageOpt = "pytorch",
    memory: MemoryOpt = None,
    cpus: CpusOpt = None,
    disk: Annotated[int | None, typer.Option(help="Data disk in GB.")] = None,
    spot: Annotated[bool, typer.Option("--spot/--on-demand")] = False,
    name: Annotated[str | None, typer.Option()] = None,
    team: Annotated[str | None, typer.Option()] = None,
    as_json: JsonFlag = False,
):
    """Rent an interactive instance (a container that keeps its disk between stops)."""
    instance = client().create_instance(
        image=image, gpu_type=gpu_type, gpus=gpus, memory_gb=memory_gb(memory), cpu_cores=cpus, disk_gb=disk,
        spot=spot, name=name, team=team,
    )  # fmt: skip
    if as_json:
        return emit_json(instance.raw)
    err.print(f"instance i{instance.id} {instance.status}; `gpucloud exec -it i{instance.id}` once it runs")
    out.print(f"i{instance.id}")


@app.command()
def ps(
    all_: Annotated[bool, typer.Option("--all", "-a", help="Finished work too.")] = False, as_json: JsonFlag = False
):
    """Your jobs and instances (running and queued; --all: finished ones too)."""
    api = client()
    jobs, instances = api.jobs(), api.instances()
    if not all_:
        jobs = [j for j in jobs if not j.finished]
        instances = [i for i in instances if i.status != "released"]
    if as_json:
        return emit_json({"jobs": [j.raw for j in jobs], "instances": [i.raw for i in instances]})
    table = Table("id", "kind", "name", "status", "gpu", "node", "exit", "created")
    for j in jobs:
        table.add_row(
            f"j{j.id}", "job", j.name, j.status, f"{j.size}×{j.gpu_type}", j.node or "-",
            "" if j.exit_code is None else str(j.exit_code), (j.created_at or "")[:19],
        )  # fmt: skip
    for i in instances:
        table.add_row(
            f"i{i.id}", "instance", i.name, i.status, f"{i.gpus}×{i.gpu_type}", i.node or "-", "",
            (i.created_at or "")[:19],
        )  # fmt: skip
    out.print(table)


@app.command()
def show(ref: Annotated[str, typer.Argument(help="j12, i7 or a3")], as_json: JsonFlag = False):
    """One job, instance or array, in full."""
    target, api = Ref(ref), client()
    item = {"job": api.job, "instance": api.instance, "array": api.array}[target.kind](target.id)
    if as_json:
        return emit_json(item.raw)
    for key, value in item.raw.items():
        if key != "tasks":
            out.print(f"{key}: {value}", highlight=False, markup=False)
    if target.kind == "array":
        table = Table("task", "job", "params", "status", "spot", "preempted", "cost", "exit")
        for task in item.tasks:
            table.add_row(
                str(task["index"]), f"j{task['job']}", " ".join(f"{k}={v}" for k, v in task["params"].items()),
                task["status"], "yes" if task["spot"] else "no", str(task["preemptions"]), str(task["cost"]),
                "" if task["exit_code"] is None else str(task["exit_code"]),
            )  # fmt: skip
        out.print(table)


@app.command()
def logs(
    ref: Annotated[str, typer.Argument(help="A job (12, j12) or an instance (i7).")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until it ends.")] = False,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines.")] = None,
    since: Annotated[str | None, typer.Option(help="Since a time: 10m, 2h or 2026-12-01T07:40:00Z.")] = None,
    rank: Annotated[int | None, typer.Option(min=0, help="A multi-node job's member: its lines only.")] = None,
    as_json: JsonFlag = False,
):
    """A job's or instance's output (stdout and stderr, kept after it ends); a multi-node job's every member's."""
    target, api = want(Ref(ref), "job", "instance"), client()
    if follow:
        raise typer.Exit(_follow(api, target.kind, target.id, tail=tail, since=since, rank=rank, as_json=as_json))
    try:
        for item in api.logs(target.kind, target.id, tail=tail, since=since, rank=rank):
            _print_log(item, as_json)
    except LogsUnavailable:
        job = api.job(target.id) if target.kind == "job" else None
        err.print("this server keeps no logs; the last output the job left:" if job else "this server keeps no logs")
        if job:
            lines = job.log_tail.splitlines(keepends=True)
            sys.stdout.write("".join(lines[-tail:] if tail else lines))


def _follow(api: Client, kind: str, object_id: int, *, tail, since, rank=None, as_json: bool = False) -> int:
    """Print the log live until the work ends; the job's exit code (1 when it has none: never ran, cancelled)."""
    end = None
    try:
        for item in api.follow_logs(kind, object_id, tail=tail, since=since, rank=rank):
            _print_log(item, as_json)
            end = item if isinstance(item, LogEnd) else end
    except LogsUnavailable:
        return _follow_status(api, kind, object_id)
    if end is None or kind != "job":
        return 0
    if end.exit_code is None:
        err.print(f"{kind} {object_id} {end.status}: {end.reason}")
        return EXIT_API
    return end.exit_code


def _follow_status(api: Client, kind: str, object_id: int) -> int:
    """Without a logs socket: the job's status changes, then the output it left (its log tail)."""
    if kind != "job":
        raise ApiError(404, "this server cannot follow an instance's output")
    seen = None
    while True:
        job = api.job(object_id)
        if job.status != seen:
            err.print(f"job {object_id} {job.status}" + (f" ({job.status_reason})" if job.status_reason else ""))
            seen = job.status
        if job.finished:
            break
        import time

        time.sleep(1)
    sys.stdout.write(job.log_tail)
    sys.stdout.flush()
    return job.exit_code if job.exit_code is not None else EXIT_API


def _print_log(item: LogLine | LogEnd, as_json: bool) -> None:
    if as_json:
        out.file.write(json.dumps({"end": asdict(item)} if isinstance(item, LogEnd) else item.shown()) + "\n")
        out.file.flush()
    elif isinstance(item, LogLine):
        stream = sys.stderr if item.stream == "stderr" else sys.stdout
        where = f"[rank {item.rank} on {item.host}] " if item.rank is not None else ""
        if item.stream == "system":
            err.print(where + item.line, style="dim", markup=False, highlight=False)  # the platform's marker
        else:
            stream.write(where + item.line + "\n")
            stream.flush()
    # The end says nothing new to a reader (the log's last "system" line gave the reason): the exit code is ours.


@app.command(name="exec", context_settings={"allow_interspersed_args": False})
def exec_(
    ref: Annotated[str, typer.Argument(help="A running job (12, j12) or instance (i7).")],
    command: Command = None,
    interactive: Annotated[bool, typer.Option("--interactive", "-i", help="Keep stdin open (always).")] = True,
    tty: Annotated[
        bool | None, typer.Option("--tty/--no-tty", "-t", help="Raw terminal (default: if stdin is one).")
    ] = None,
):
    """A shell in a running job or instance (-- CMD: run CMD in it instead); exits with the shell's exit code."""
    target = want(Ref(ref), "job", "instance")
    text = " ".join(_quote(part) for part in command or [])
    line = None if text in ("", "bash", "sh", "bash -l") else f"exec {text}"
    raise typer.Exit(terminal_session(client(), target.kind, target.id, command=line, tty=tty))


@app.command()
def cp(
    source: Annotated[str, typer.Argument(help="A local path, or ID:/path (j12:/root/checkpoints/out.txt).")],
    destination: Annotated[str, typer.Argument(help="A local path, or ID:/folder.")],
):
    """Copy a file into or out of a running job or instance (ID:/path on one side)."""
    api = client()
    remote_source, remote_destination = _remote(source), _remote(destination)
    if bool(remote_source) == bool(remote_destination):
        raise typer.BadParameter("one side is ID:/path (a job or instance), the other a local path")
    if remote_source:
        target, path = remote_source
        written = api.download(target.kind, target.id, path, destination)
        err.print(f"{source} -> {written}")
    else:
        target, path = remote_destination
        local = Path(source)
        if not local.is_file():
            raise typer.BadParameter(f"{source} is not a file")
        folder, name = (path.rstrip("/"), local.name) if path.endswith("/") else _split(path, local.name, api, target)
        where = api.upload(target.kind, target.id, local, folder, name)
        err.print(f"{source} -> {target}:{where}")


def _remote(text: str) -> tuple[Ref, str] | None:
    head, sep, path = text.partition(":")
    if not sep or not path.startswith("/") or "/" in head:
        return None
    try:
        return want(Ref(head), "job", "instance"), path
    except typer.BadParameter:
        return None


def _split(path: str, fallback: str, api: Client, target: Ref) -> tuple[str, str]:
    """A remote destination without a trailing slash: a folder if it is one there, else folder + new name."""
    parent, _, name = path.rpartition("/")
    try:
        if any(e.name == name and e.dir for e in api.files(target.kind, target.id, parent or "/")):
            return path, fallback
    except ApiError:
        pass
    return parent or "/", name


# -- actions ------------------------------------------------------------------------------------------


def _act(ref: str, default: str, actions: dict, as_json: bool):
    target = Ref(ref, default=default)
    if target.kind not in actions:
        raise typer.BadParameter(f"{target} is a {target.kind}; this takes a {' or '.join(actions)}")
    result = actions[target.kind](client(), target.id)
    if as_json:
        return emit_json(result.raw)
    err.print(f"{target}: {result.status}" + (f" ({result.status_reason})" if result.status_reason else ""))


@app.command()
def cancel(
    ref: Annotated[str, typer.Argument(help="A job (12, j12) or a whole array (a3).")], as_json: JsonFlag = False
):
    """Cancel a job, or every task of an array."""
    _act(ref, "job", {"job": Client.cancel_job, "array": Client.cancel_array}, as_json)


@app.command()
def retry(ref: Annotated[str, typer.Argument(help="An array (a3).")], as_json: JsonFlag = False):
    """Queue an array's failed and cancelled tasks again."""
    _act(ref, "array", {"array": Client.retry_array}, as_json)


def _instance_action(action: str):
    def act(client_: Client, instance_id: int):
        return client_.instance_action(instance_id, action)

    return act


@app.command()
def start(ref: Annotated[str, typer.Argument(help="An instance (7, i7).")], as_json: JsonFlag = False):
    """Start a stopped instance."""
    _act(ref, "instance", {"instance": _instance_action("start")}, as_json)


@app.command()
def stop(
    ref: Annotated[str, typer.Argument(help="An instance (7, i7) or a job (j12: cancel).")], as_json: JsonFlag = False
):
    """Stop an instance (its disk stays); for a job, the same as cancel."""
    _act(ref, "instance", {"instance": _instance_action("stop"), "job": Client.cancel_job}, as_json)


@app.command()
def restart(ref: Annotated[str, typer.Argument(help="An instance (7, i7).")], as_json: JsonFlag = False):
    """Restart a running instance."""
    _act(ref, "instance", {"instance": _instance_action("restart")}, as_json)


@app.command()
def release(ref: Annotated[str, typer.Argument(help="An instance (7, i7) or a job (j12).")], as_json: JsonFlag = False):
    """Delete an instance or job for good (its disk too)."""
    _act(ref, "instance", {"instance": _instance_action("release"), "job": Client.release_job}, as_json)


@app.command(name="save-image")
def save_image(
    ref: Annotated[str, typer.Argument(help="A stopped instance (7, i7).")],
    name: Annotated[str, typer.Argument(help="The new image's name.")],
    as_json: JsonFlag = False,
):
    """Save a stopped instance's system disk as an image of yours."""
    target = want(Ref(ref, default="instance"), "instance")
    image = client().save_image(target.id, name)
    if as_json:
        return emit_json(image.raw)
    err.print(f"image {image.id} {image.status}")


@app.command()
def arrays(as_json: JsonFlag = False):
    """Your job arrays (sweeps): progress and cost."""
    found = client().arrays()
    if as_json:
        return emit_json([a.raw for a in found])
    table = Table("id", "name", "status", "done", "running", "queued", "failed", "cost")
    for a in found:
        c = a.counts
        table.add_row(
            f"a{a.id}", a.name, a.status, f"{c.get('done', 0)}/{a.total}", str(c.get("running", 0)),
            str(c.get("queued", 0)), str(c.get("failed", 0)), f"{a.cost} {a.currency}",
        )  # fmt: skip
    out.print(table)


def _quote(part: str) -> str:
    import shlex

    return shlex.quote(part)


def main() -> None:
    try:
        app()
    except GpuCloudError as exc:
        err.print(f"gpucloud: {exc}", highlight=False, markup=False)
        sys.exit(exc.exit_code)
    except typer.BadParameter as exc:  # raised outside click's parsing (in a command's body)
        err.print(f"gpucloud: {exc.format_message()}", highlight=False, markup=False)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # an answer the client's checks let through, or a bug: a sentence, not a traceback
        if os.environ.get("GPUCLOUD_DEBUG"):
            raise
        err.print(f"gpucloud: unexpected {type(exc).__name__}: {exc} (GPUCLOUD_DEBUG=1 shows where)", markup=False)
        sys.exit(EXIT_API)


__all__ = ["Job", "app", "main"]
