"""The fake NVIDIA tools answer as driver r580.159.04 did on a real H200 (``docs/gpu-check/2026-12-04-run*``):
each test names the run and step its expectation comes from. Runs as root; other uids through ``setpriv``."""

import json
import os
import re
import signal
import time
from pathlib import Path

from agent.mps import parse_ps
from tests.fakes.nvidia import NOBODY, FakeNvidia, first_line
from tests.fakes.nvidia._cards import started

RUNS = Path(__file__).resolve().parents[2] / "docs" / "gpu-check"
INSUFFICIENT = (
    "Insufficient privileges for UID {}. Control deamon settings can only be modified by the user who started it "
    "or by the root user."
)
LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} Control [ \d]{5}\] ")


def measured(run: int, step: str) -> dict:
    for line in (RUNS / f"2026-12-04-run{run}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["step"] == step:
            return record
    raise LookupError(step)


def up(fake, pipe, **kw) -> None:
    result = fake.daemon(pipe, **kw)
    assert result.returncode == 0, result.stdout + result.stderr
    assert fake.ask(pipe, "get_server_list") == ""  # it answers: the parent returned once it listened


def configured(fake, pipe, percentage: int, memory: str) -> None:
    assert fake.ask(pipe, f"set_default_active_thread_percentage {percentage}") == f"{percentage}.0"
    assert fake.ask(pipe, f"set_default_device_pinned_mem_limit 0 {memory}") == ""


def socket_view(fake, pipe: Path) -> Path:
    """What a tenant sees when only the ``control`` socket is put in its pipe directory (run2 ``socket``)."""
    view = fake.state / "socket-view"
    view.mkdir(exist_ok=True)
    view.chmod(0o755)
    (view / "control").symlink_to(pipe / "control")
    return view


def owner(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M)[1])


def ended(process, timeout: float = 10) -> tuple[int, list[dict]]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, [json.loads(line) for line in out.splitlines()]


def test_usage_and_options_it_does_not_have(fake_nvidia):
    """run2 ``card``: the usage; ``-p 3 -a <toml>`` (MPS v3) prints it, exits 0, starts nothing."""
    usage = measured(2, "card")["mps_control_usage"]
    shown = fake_nvidia.run(["nvidia-cuda-mps-control", "-h"])
    assert (shown.returncode, shown.stdout.strip()) == (0, usage)
    pipe = fake_nvidia.pipe()
    v3 = fake_nvidia.run(["nvidia-cuda-mps-control", "-d", "-p", "3", "-a", "x.toml"], pipe=pipe)
    assert (v3.returncode, v3.stdout.strip()) == (0, usage)
    assert list(pipe.iterdir()) == [] and fake_nvidia.daemons() == []


def test_no_daemon(fake_nvidia):
    """No daemon on the pipe: the front-end says so and fails (the only non-zero status)."""
    result = fake_nvidia.control(fake_nvidia.pipe(), "get_server_list")
    assert (result.returncode, result.stdout.strip()) == (1, "Cannot find MPS control daemon process")


def test_daemon_files_answers_and_log(fake_nvidia):
    """Every run's ``daemon`` step: the pipe's files, the raw answers; run2's control.log lines."""
    pipe = fake_nvidia.pipe()
    up(fake_nvidia, pipe)
    daemon = measured(3, "daemon")  # a 0.25 class: 25.0, 35G
    assert sorted(p.name for p in pipe.iterdir()) == daemon["pipe"]
    modes = {p.name: oct(p.lstat().st_mode & 0o777) for p in pipe.iterdir()}
    assert (modes["control"], modes["control_privileged"]) == ("0o666", "0o755")
    assert int((pipe / "nvidia-cuda-mps-control.pid").read_text()) in fake_nvidia.daemons()
    assert fake_nvidia.ask(pipe, "get_default_active_thread_percentage") == "100.0"
    configured(fake_nvidia, pipe, 25, "35942M")
    for command, answer in daemon["raw"].items():
        result = fake_nvidia.control(pipe, command)
        assert (result.returncode, result.stdout.strip()) == (answer["rc"], answer["out"]), command
    configured(fake_nvidia, pipe, 50, "71885M")
    assert (
        fake_nvidia.ask(pipe, "get_default_device_pinned_mem_limit 0")
        == measured(1, "daemon")["raw"]["get_default_device_pinned_mem_limit 0"]["out"]
    )
    again = fake_nvidia.daemon(pipe)
    assert (again.returncode, again.stdout.strip()) == (0, "An instance of this daemon is already running")
    assert len(fake_nvidia.daemons()) == 1
    real = measured(2, "control_from_a_tenant")["control_log_tail"].splitlines()[1:]  # the first is cut
    assert real and all(LOG_LINE.match(line) for line in real)
    log = (fake_nvidia.log_of(pipe) / "control.log").read_text().splitlines()
    assert all(LOG_LINE.match(line) for line in log)
    assert [line[LOG_LINE.match(line).end() :] for line in log[-5:]] == [
        "Accepting connection...",
        "NEW UI",
        "Cmd:get_default_device_pinned_mem_limit 0",
        "70G",
        "UI closed",
    ]


def test_defaults_reach_upcoming_servers_only(fake_nvidia):
    """run2 ``control_from_a_tenant``: the default moved, the running server kept its own; a server
    outlives its clients (run3 ``eager_server``); per-server settings reach the clients that come after."""
    pipe = fake_nvidia.pipe()
    up(fake_nvidia, pipe)
    configured(fake_nvidia, pipe, 50, "71885M")
    first = fake_nvidia.client(pipe, hold=0, grab=True)
    got = first_line(first)
    assert (got["sm_count"], got["memory_limit_mb"], got["grabbed_mb"]) == (66, 71885, 71168)  # run1/2 ``pair``
    assert ended(first)[0] == 0
    server = got["server"]
    assert fake_nvidia.ask(pipe, "get_server_list") == str(server)  # no client left, the server stays
    configured(fake_nvidia, pipe, 25, "35942M")
    assert fake_nvidia.ask(pipe, "get_default_active_thread_percentage") == "25.0"
    assert fake_nvidia.ask(pipe, f"get_active_thread_percentage {server}") == "50.0"
    assert fake_nvidia.ask(pipe, f"get_device_pinned_mem_limit {server} 0") == "70G"
    assert first_line(fake_nvidia.client(pipe, hold=0))["sm_count"] == 66
    assert fake_nvidia.ask(pipe, f"set_active_thread_percentage {server} 25") == "25.0"
    assert fake_nvidia.ask(pipe, f"set_device_pinned_mem_limit {server} 0 35942M") == ""
    after = first_line(fake_nvidia.client(pipe, hold=0, grab=True))
    assert (after["sm_count"], after["memory_limit_mb"], after["grabbed_mb"]) == (32, 35942, 35328)  # run2 small
    assert fake_nvidia.ask(pipe, "get_active_thread_percentage 99999999") == "Server 99999999 not found"


def test_client_environment_lowers_never_raises(fake_nvidia):
    """run2 ``environment``: a tenant asking 100 % and the card's memory gets the server's 25 % / 35,942."""
    pipe = fake_nvidia.pipe()
    up(fake_nvidia, pipe)
    configured(fake_nvidia, pipe, 25, "35942M")
    raised = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=143771M"}
    got = first_line(fake_nvidia.client(pipe, hold=0, grab=True, env=raised))
    assert (got["thread_percentage"], got["sm_count"], got["grabbed_mb"]) == (25, 32, 35328)
    lowered = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{got['device']}=8G"}
    low = first_line(fake_nvidia.client(pipe, hold=0, grab=True, env=lowered))
    assert (low["thread_percentage"], low["sm_count"], low["memory_limit_mb"], low["grabbed_mb"]) == (
        10,
        12,
        8192,
        7680,
    )


def test_privileges_through_each_socket(fake_nvidia):
    """run1 and run2 ``control_from_a_tenant``: root with the whole pipe directory may do everything; root
    with ``control`` alone may not change the defaults or quit but may change its server and end its
    clients; nobody may only read."""
    pipe = fake_nvidia.pipe()
    up(fake_nvidia, pipe)
    configured(fake_nvidia, pipe, 25, "35942M")
    holder = fake_nvidia.client(pipe, hold=30)
    server, victim = first_line(holder)["server"], holder.pid
    view = socket_view(fake_nvidia, pipe)

    def said(where, command, user=None):
        result = fake_nvidia.control(where, command, user=user)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout.strip()

    for user, who in ((None, 0), (NOBODY, NOBODY)):
        where = view if user is None else pipe
        assert said(where, "get_server_list", user) == str(server)
        assert [c.pid for c in parse_ps(said(where, "ps", user))] == [victim]
        for command in ("set_default_active_thread_percentage 100", "set_default_device_pinned_mem_limit 0 200G"):
            assert said(where, command, user) == INSUFFICIENT.format(who)
        assert said(where, "quit", user) == "Not enough privilege to execute quit command"
    for command in (f"set_active_thread_percentage {server} 100", f"set_device_pinned_mem_limit {server} 0 200G"):
        assert said(pipe, command, NOBODY) == INSUFFICIENT.format(NOBODY)  # a root server: not nobody's
    assert said(pipe, f"terminate_client {server} {victim}", NOBODY) == INSUFFICIENT.format(NOBODY) + "\n800"
    assert fake_nvidia.ask(pipe, "get_default_active_thread_percentage") == "25.0"
    assert fake_nvidia.ask(pipe, f"get_active_thread_percentage {server}") == "25.0"
    assert holder.poll() is None
    # root through control alone: its own server's limits and clients (run2 root/socket)
    assert said(view, f"set_active_thread_percentage {server} 100") == "100.0"
    assert said(view, f"set_device_pinned_mem_limit {server} 0 200G") == ""
    assert said(view, f"terminate_client {server} {victim}") == "0"
    assert ended(holder)[1][-1] == {"error": "the MPS client has been terminated by the server"}
    # root with the whole directory: control_privileged (run1 root/dir)
    assert said(pipe, "set_default_active_thread_percentage 100") == "100.0"
    assert said(pipe, "quit") == ""
    assert fake_nvidia.daemons() == [] and not (pipe / "control").exists()
    assert fake_nvidia.control(view, "get_server_list").returncode == 1


def test_a_tenants_own_server_is_its_to_change_unless_multiuser(fake_nvidia):
    """run5: without -M the server runs as the tenant's uid, which may then raise its limits and end its
    clients; run6: with -M the server is root's and the same commands are refused."""
    for multiuser, server_uid in ((False, NOBODY), (True, 0)):
        pipe = fake_nvidia.pipe(f"multiuser-{multiuser}")
        up(fake_nvidia, pipe, multiuser=multiuser)
        configured(fake_nvidia, pipe, 25, "35942M")
        holder = fake_nvidia.client(pipe, hold=30, user=NOBODY)
        got = first_line(holder)
        server = got["server"]
        assert (owner(server), got["sm_count"]) == (server_uid, 32)
        asks = (f"set_active_thread_percentage {server} 100", f"terminate_client {server} {holder.pid}", "quit")
        answers = [fake_nvidia.ask(pipe, command, user=NOBODY) for command in asks]
        if multiuser:
            assert answers[:2] == [INSUFFICIENT.format(NOBODY), INSUFFICIENT.format(NOBODY) + "\n800"]
            assert holder.poll() is None
        else:
            assert answers[:2] == ["100.0", "0"]
            assert ended(holder)[1][-1] == {"error": "the MPS client has been terminated by the server"}
        assert answers[2] == "Not enough privilege to execute quit command"
        holder.kill()
        holder.wait()
        assert fake_nvidia.ask(pipe, "quit") == ""


def test_start_server_and_the_exclusive_card(fake_nvidia):
    """run3/run4 ``eager_server``: ``start_server -uid 0`` answers nothing and its server holds the
    exclusive card with no client: a process that does not come through the pipe gets no context
    (run1 ``bypass``); with no server it gets the whole card (run2 ``bypass``, ``alone``), and holds it."""
    uuid = fake_nvidia.uuids[0]
    nowhere = {"CUDA_MPS_PIPE_DIRECTORY": "/nowhere", "CUDA_VISIBLE_DEVICES": uuid}
    assert fake_nvidia.run(["nvidia-smi", "-i", uuid, "-c", "EXCLUSIVE_PROCESS"]).returncode == 0
    pipe = fake_nvidia.pipe()
    up(fake_nvidia, pipe)
    assert fake_nvidia.ask(pipe, "start_server -uid 0") == ""
    servers = fake_nvidia.ask(pipe, "get_server_list").split()
    assert len(servers) == 1 and int(servers[0]) in fake_nvidia.holders(uuid)
    assert fake_nvidia.ask(pipe, "ps") == ""  # a server, no client (run1 root/dir/ps)
    bypass = fake_nvidia.client(None, hold=0, env=nowhere)
    assert ended(bypass) == (1, [{"context": False, "error": "CUDA-capable device(s) is/are busy or unavailable"}])
    tenant = first_line(fake_nvidia.client(pipe, hold=0))
    assert (tenant["context"], tenant["mps"], tenant["server"]) == (True, True, int(servers[0]))
    assert fake_nvidia.ask(pipe, "quit") == ""
    alone = fake_nvidia.client(None, hold=30, grab=True, env=nowhere)
    got = first_line(alone)
    assert (got["mps"], got["sm_count"], got["grabbed_mb"]) == (False, 132, 142336)  # run1/2 ``alone``
    second = fake_nvidia.client(None, hold=0, env=nowhere)
    assert ended(second)[0] == 1  # exclusive: the first holds it
    alone.send_signal(signal.SIGTERM)
    alone.wait(10)
    assert fake_nvidia.holders(uuid) == []
    assert fake_nvidia.run(["nvidia-smi", "-i", uuid, "-c", "DEFAULT"]).returncode == 0
    shared = [fake_nvidia.client(None, hold=5, env=nowhere) for _ in range(2)]
    assert [first_line(p)["context"] for p in shared] == [True, True]


def test_ps_terminate_and_sigkill(fake_nvidia):
    """run2 ``two_processes``: ``ps``'s table as printed, read by ``agent.mps.parse_ps``; ``terminate_client``
    ends its client and faults the server's others (XID 31); a SIGKILLed client just leaves the table."""
    pipe = fake_nvidia.pipe()
    up(fake_nvidia, pipe)
    configured(fake_nvidia, pipe, 25, "35942M")
    tenants = [fake_nvidia.client(pipe, hold=30) for _ in range(3)]
    server = {first_line(p)["server"] for p in tenants}.pop()
    table = fake_nvidia.ask(pipe, "ps")
    real = measured(2, "two_processes")["terminate_client"]["ps"].splitlines()
    lines = table.splitlines()
    assert lines[0] == real[0]
    uuid, row = fake_nvidia.uuids[0], re.compile(r"(\d+ +)(\d+ +)(\d+ +)(GPU-\S+ +)(\d+ +)(.+)")
    widths = [len(field) for field in row.fullmatch(real[1]).groups()[:5]]
    by_pid = {int(line.split()[0]): row.fullmatch(line).groups() for line in lines[1:]}
    assert sorted(by_pid) == sorted(p.pid for p in tenants)
    for process in tenants:
        fields = by_pid[process.pid]
        assert [len(field) for field in fields[:5]] == widths
        namespace = os.stat(f"/proc/{process.pid}/ns/pid").st_ino
        command = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        expected = [str(process.pid), str(server), uuid[:22], str(namespace), command]
        assert [fields[0].strip(), *(field.strip() for field in fields[2:])] == expected
    assert sorted((c.pid, c.server) for c in parse_ps(table)) == sorted((p.pid, server) for p in tenants)
    killed, victim, other = tenants
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    deadline = time.monotonic() + 5
    while killed.pid in [c.pid for c in parse_ps(fake_nvidia.ask(pipe, "ps"))] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(c.pid for c in parse_ps(fake_nvidia.ask(pipe, "ps"))) == sorted([victim.pid, other.pid])
    assert other.poll() is None and victim.poll() is None  # run2 ``sigkill``: others ran on
    assert fake_nvidia.ask(pipe, f"terminate_client {server} {victim.pid}") == "0"
    assert ended(victim) == (1, [{"error": "the MPS client has been terminated by the server"}])
    assert ended(other) == (1, [{"error": "an illegal memory access was encountered"}])
    assert parse_ps(fake_nvidia.ask(pipe, "ps")) == []
    assert fake_nvidia.ask(pipe, f"get_server_status {server}") == "ACTIVE"  # every faulted client gone
    assert first_line(fake_nvidia.client(pipe, hold=0))["server"] == server


def test_another_uid_waits_for_the_server(fake_nvidia):
    """The MPS guide: one uid's server at a time; a client of another uid is queued until the server has
    no client, then gets a server of its own (this fake queues it rather than failing it with 805)."""
    pipe = fake_nvidia.pipe()
    up(fake_nvidia, pipe)
    root_client = fake_nvidia.client(pipe, hold=1)
    root_server = first_line(root_client)["server"]
    waiting = fake_nvidia.client(pipe, hold=0, user=NOBODY)
    time.sleep(0.3)
    assert waiting.poll() is None and fake_nvidia.ask(pipe, "get_server_list") == str(root_server)
    got = first_line(waiting)  # once root's client ended
    assert root_client.wait(5) == 0
    assert got["server"] != root_server and owner(got["server"]) == NOBODY
    assert fake_nvidia.ask(pipe, "get_server_list") == str(got["server"])


def test_quit_waits_for_clients(fake_nvidia):
    """The man page: quit stops the daemon once its clients are done, and returns when it is gone."""
    pipe = fake_nvidia.pipe()
    up(fake_nvidia, pipe)
    client = fake_nvidia.client(pipe, hold=1)
    first_line(client)
    began = time.monotonic()
    result = fake_nvidia.control(pipe, "quit")
    assert (result.returncode, result.stdout) == (0, "")
    assert client.wait(1) == 0 and time.monotonic() - began > 0.5
    assert fake_nvidia.daemons() == [] and sorted(p.name for p in pipe.iterdir()) == ["control_lock", "log"]
    assert fake_nvidia.control(pipe, "get_server_list").returncode == 1


def test_nvidia_smi_compute_mode_and_query(fake_nvidia):
    """``nvidia-smi -c`` and ``--query-gpu`` as the agent and ``bench/gpu_check.py`` call them."""
    uuid = fake_nvidia.uuids[0]
    query = ["nvidia-smi", "-i", uuid, "--query-gpu=name,uuid,memory.total,driver_version,compute_mode"]
    line = fake_nvidia.run([*query, "--format=csv,noheader,nounits"]).stdout.strip()
    card = measured(2, "card")
    assert line == f"{card['name']}, {uuid}, {card['memory_mb']}, {card['driver']}, {card['compute_mode']}"
    set_it = fake_nvidia.run(["nvidia-smi", "-i", uuid, "-c", "EXCLUSIVE_PROCESS"])
    assert re.fullmatch(
        r"Set compute mode to EXCLUSIVE_PROCESS for GPU 00000000:[0-9A-F]{2}:00\.0\.\nAll done\.\n", set_it.stdout
    )
    again = fake_nvidia.run(["nvidia-smi", "-i", "0", "-c", "3"])
    assert again.returncode == 0
    assert again.stdout == set_it.stdout.replace("Set compute mode to", "Compute mode is already set to")
    shown = fake_nvidia.run([*query[:3], "--query-gpu=compute_mode", "--format=csv,noheader"]).stdout.strip()
    assert shown == measured(2, "daemon")["compute_mode"] == "Exclusive_Process"
    assert fake_nvidia.run(["nvidia-smi", "-i", uuid, "-c", "1"]).returncode != 0  # EXCLUSIVE_THREAD is gone
    assert fake_nvidia.run(["nvidia-smi", "-i", uuid, "-c", "EXCLUSIVE_THREAD"]).returncode != 0
    nobody = fake_nvidia.run(["nvidia-smi", "-i", uuid, "-c", "DEFAULT"], user=NOBODY)
    assert nobody.returncode == 4 and "Insufficient Permissions" in nobody.stdout
    assert fake_nvidia.compute_mode(uuid) == "EXCLUSIVE_PROCESS"
    for mode, shown in (("2", "Prohibited"), ("PROHIBITED", "Prohibited"), ("0", "Default"), ("DEFAULT", "Default")):
        assert fake_nvidia.run(["nvidia-smi", "-i", uuid, "-c", mode]).returncode == 0
        assert (
            fake_nvidia.run([*query[:3], "--query-gpu=compute_mode", "--format=csv,noheader"]).stdout.strip() == shown
        )
    unknown = fake_nvidia.run(["nvidia-smi", "-i", "GPU-00000000-0000-0000-0000-000000000000", "-c", "0"])
    assert (unknown.returncode, unknown.stdout.strip()) == (6, "No devices were found")
    assert "CUDA Version: 13.0" in fake_nvidia.run(["nvidia-smi"]).stdout  # ``card``: cuda


def test_stop_ends_every_fake():
    """Without the fixture: ``FakeNvidia.stop()`` ends daemons, their servers and clients."""
    fake = FakeNvidia()
    pipe = fake.pipe()
    up(fake, pipe)
    client = fake.client(pipe, hold=60)
    server = first_line(client)["server"]
    alone = fake.client(None, hold=60, env={"CUDA_MPS_PIPE_DIRECTORY": "/nowhere"})
    first_line(alone)
    daemons = fake.daemons()
    fake.stop()
    deadline = time.monotonic() + 5
    pids = [*daemons, server, client.pid, alone.pid]
    while any(started(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if started(pid)] == []  # gone, or a zombie of whoever adopted it
    assert not fake.state.exists()
