"""A GPU host taken by its tenant (issue 31): holding exactly that host's credentials — its agent's environment,
keys folder and database role, from its own network namespace — every attack on other hosts' work, anyone's bill
or the control plane's reach is refused. What a taken host can still do is in the README's known limits.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from core.relay import Op, Ticket, ticket_sign
from core.relay_tls import relay_http
from tests.cluster.harness import ROOT, wait_until

pytestmark = pytest.mark.cluster

# Run as the taken host: its database role, from its own address. Each attack is a statement; the answer, per
# statement, is "denied: <why>" or the rows / row count it got.
ATTACKS = r"""
import json, sys
import psycopg
url, attacks = sys.argv[1], json.loads(sys.argv[2])
answers = {}
with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
    for name, (statement, params) in attacks.items():
        try:
            cursor = conn.execute(statement, params)
            answers[name] = cursor.fetchall() if cursor.description else cursor.rowcount
        except psycopg.Error as exc:
            answers[name] = "denied: " + (exc.diag.message_primary or str(exc))
print(json.dumps(answers, default=str))
"""


def process_environ(cluster, name: str) -> dict:
    raw = Path(f"/proc/{cluster.pid(name)}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def agent_environ(cluster, i: int) -> dict:
    return process_environ(cluster, f"h{i}-agent")


def run_as_host(cluster, i: int, script: str, url: str, attempts: dict) -> dict:
    """``script`` run from host i's namespace with ``url`` (one of its credentials) and ``attempts`` (JSON): the
    answers it prints (JSON)."""
    done = subprocess.run(
        ["nsenter", f"--net={cluster.host_netns(i)}", sys.executable, "-c", script, url, json.dumps(attempts)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def as_host(cluster, i: int, attacks: dict) -> dict:
    """``attacks`` (name -> (SQL, params)) sent with host i's database role from its namespace: what each got."""
    return run_as_host(cluster, i, ATTACKS, agent_environ(cluster, i)["DATABASE_URL"], attacks)


def test_a_host_checks_relay_tickets_but_holds_no_key_that_makes_them(cluster):
    """Its keys folder holds the relay's public key and not its signing key; with exactly the host's environment,
    making a ticket fails, and a ticket signed with a key of the host's own making is refused by another host's
    relay (the control plane's are taken: every terminal, files and move test uses them)."""
    environ = agent_environ(cluster, 1)
    keys = Path(environ["KEYS_DIR"])
    assert (keys / "relay.pub").is_file() and not (keys / "relay.key").exists()
    make = "from core.relay import *; ticket_sign(Ticket(op=Op.LIST, container='c', workload=1, user=1))"
    made = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", make], env=environ, cwd=ROOT, capture_output=True, text=True
    )
    assert made.returncode != 0 and "RELAY_SIGNING_KEY" in made.stderr, made.stderr[-2000:]
    ((relay_url, pin),) = cluster.sql("SELECT relay_url, relay_tls_sha256 FROM scheduler_node WHERE name = 'h2'")
    assert relay_url.startswith("https://") and len(pin) == 64  # over TLS, its certificate registered
    ticket = Ticket(op=Op.LIST, container="c", workload=1, user=1, root="/root/autodl-tmp", path="/root/autodl-tmp")
    forged = ticket_sign(ticket, key=Ed25519PrivateKey.generate())
    headers = {"Authorization": f"Bearer {forged}"}
    answer = relay_http(pin).get(f"{relay_url}/v1/list", headers=headers, timeout=10)
    assert answer.status_code == 401 and answer.json() == {"detail": "the ticket is not valid"}


def test_a_taken_hosts_database_role_reaches_no_other_work_no_bill_and_not_its_own_address(cluster):
    """With its own work running and another host's: it reads neither another's command nor environment, bills
    nothing it did not run (no payer of its choosing, no back-dated start), touches no other host's work, and
    cannot move the address the control plane calls its relay at."""
    mine = cluster.wait_instance(cluster.create_instance("RTX3090")["id"], "running")
    theirs = cluster.wait_instance(cluster.create_instance("A100-80GB")["id"], "running")  # only on h2
    try:
        host = int(mine["node"][1:])
        assert host != 2
        (mine_w,), (theirs_w,) = (
            cluster.sql("SELECT workload_id FROM portal_instance WHERE id = %s", (i["id"],))[0] for i in (mine, theirs)
        )
        ((payer,),) = cluster.sql("SELECT id FROM billing_account WHERE kind = 'user' ORDER BY id LIMIT 1")
        ((address,),) = cluster.sql("SELECT address FROM scheduler_node WHERE name = %s", (f"h{host}",))
        segment = (
            "INSERT INTO billing_metersegment (workload_id, started_at, end_reason, no_gpu, spot, cards{}) "
            "VALUES (%s, now() - interval '1 day', '', false, false, 1{})"
        )
        answers = as_host(
            cluster,
            host,
            {
                "my spec": ("SELECT count(*) FROM scheduler_workloadspec WHERE workload_id = %s", [mine_w]),
                "their spec": ("SELECT count(*) FROM scheduler_workloadspec WHERE workload_id = %s", [theirs_w]),
                "their work stopped": ("UPDATE scheduler_workload SET status = 'stopped' WHERE id = %s", [theirs_w]),
                "a payer of mine": (segment.format(", account_id", ", %s"), [mine_w, payer]),
                "a day back-dated": (segment.format("", ""), [mine_w]),
                "a start a day ago": (
                    "INSERT INTO scheduler_workloadevent (workload_id, from_status, to_status, reason, created_at) "
                    "VALUES (%s, 'stopped', 'running', '', now() - interval '1 day')",
                    [mine_w],
                ),
                "my address moved": (
                    "UPDATE scheduler_node SET address = '169.254.169.254' WHERE name = %s",
                    [f"h{host}"],
                ),
                "the users": ("SELECT count(*) FROM auth_user", []),
            },
        )
        assert answers["my spec"] == [[1]], answers  # what it runs: its own
        assert answers["their spec"] == [[0]], answers
        assert answers["their work stopped"] == 0, answers
        for refused in ("a payer of mine", "a day back-dated", "a start a day ago", "my address moved", "the users"):
            assert str(answers[refused]).startswith("denied: "), (refused, answers[refused])
        ((now_address, status),) = cluster.sql(
            "SELECT n.address, w.status FROM scheduler_node n, scheduler_workload w WHERE n.name = %s AND w.id = %s",
            (f"h{host}", theirs_w),
        )
        assert (now_address, status) == (address, "running")
    finally:
        cluster.release(mine["id"])
        cluster.release(theirs["id"])


def test_a_task_signed_with_a_hosts_key_is_refused_by_other_hosts_and_a_stale_cleanup_deletes_nothing_live(cluster):
    """Each host signs with its own key and trusts only its own and the control plane's: a MOVE_CLEANUP naming the
    move of an instance running on h2, sent with h1's environment and keys from h1, does not reach h2's queue (h1's
    Redis user may not push there); put there with Redis's administrator password, it is refused by h2's agent as
    signed by a key it does not know. The same cleanup signed by the control plane (a stale or redelivered message)
    is refused too: destructive node tasks check the database before acting. Its container and data disk stay."""
    victim = cluster.wait_instance(cluster.create_instance("A100-80GB")["id"], "running")  # only on h2
    try:
        ((workload, uid),) = cluster.sql(
            "SELECT w.id, w.uid FROM portal_instance i JOIN scheduler_workload w ON w.id = i.workload_id "
            "WHERE i.id = %s",
            (victim["id"],),
        )
        ((move,),) = cluster.sql(
            "INSERT INTO scheduler_move (workload_id, source_id, target_id, status, phase, snapshot_ref, bytes_done, "
            "sent_sha256, received_sha256, error) SELECT %s, s.id, t.id, 'copying', '', '', 0, '', '', '' "
            "FROM scheduler_node s, scheduler_node t WHERE s.name = 'h2' AND t.name = 'h1' RETURNING id",
            (workload,),
        )
        send = f"from core.messages import ToNode, send; send(ToNode.MOVE_CLEANUP, {move}, 'source', node='h2')"
        log = cluster.directory / "log" / "h2-agent.log"
        h1, control_plane = agent_environ(cluster, 1), process_environ(cluster, "scheduler")

        def sent_as(sender: str, environ: dict) -> subprocess.CompletedProcess:
            netns = ["nsenter", f"--net={cluster.host_netns(1)}"] if sender == "h1" else []
            return subprocess.run(
                [*netns, sys.executable, "manage.py", "shell", "-c", send],
                env=environ,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )

        # h1's own Redis user cannot even put it in h2's queue (core.redis_acl) ...
        refused = sent_as("h1", h1)
        assert refused.returncode != 0 and "no permissions" in refused.stderr, refused.stderr[-2000:]
        # ... and put there by another way (Redis's administrator password, say), h2 refuses h1's signature.
        for sender, environ, refusal in [
            ("h1", h1 | {"REDIS_URL": control_plane["REDIS_URL"]}, "Unknown certificate"),
            ("the control plane", control_plane, f"move {move} cleanup of its source refused"),
        ]:
            sent = sent_as(sender, environ)
            assert sent.returncode == 0, sent.stderr[-2000:]
            wait_until(
                lambda refusal=refusal: refusal in log.read_text(errors="replace"),
                timeout=30,
                what=f"h2's agent to refuse the cleanup sent by {sender}",
            )
        engine = cluster.engine(2)
        assert engine.containers.get(victim["container_id"]).status == "running"
        assert [v for v in engine.volumes.list() if uid in v.name], "its data disk is still there"
    finally:
        cluster.sql(
            "DELETE FROM scheduler_move WHERE workload_id IN (SELECT workload_id FROM portal_instance WHERE id = %s)",
            (victim["id"],),
        )
        cluster.release(victim["id"])


def test_the_control_plane_takes_from_a_host_only_its_own_replies_and_the_tasks_hosts_may_send(cluster):
    """Signed with h1's key from h1: a report on a move between h2 and h3 (which would fail it, or finish it
    with checksums of its choosing) and a control-plane task no host may send are refused by the scheduler
    worker, which logs each; the move stays as it was."""
    ((workload,),) = cluster.sql("SELECT id FROM scheduler_workload ORDER BY id LIMIT 1")
    ((move,),) = cluster.sql(
        "INSERT INTO scheduler_move (workload_id, source_id, target_id, status, phase, snapshot_ref, bytes_done, "
        "sent_sha256, received_sha256, error) SELECT %s, s.id, t.id, 'copying', '', '', 0, '', '', '' "
        "FROM scheduler_node s, scheduler_node t WHERE s.name = 'h2' AND t.name = 'h3' RETURNING id",
        (workload,),
    )
    try:
        send = (
            "from core.messages import ToScheduler, send; "
            f"send(ToScheduler.MOVE_REPORT, {move}, {{'error': 'forged by h1'}}); "
            "send(ToScheduler.TELEMETRY_PRUNE)"
        )
        sent = subprocess.run(
            ["nsenter", f"--net={cluster.host_netns(1)}", sys.executable, "manage.py", "shell", "-c", send],
            env=agent_environ(cluster, 1),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sent.returncode == 0, sent.stderr[-2000:]
        log = cluster.directory / "log" / "scheduler.log"
        for refusal in (
            f"refused a report on move {move} from host h1",
            "refused scheduler.tasks.telemetry_prune from host h1: hosts may not send it",
        ):
            wait_until(
                lambda refusal=refusal: refusal in log.read_text(errors="replace"),
                timeout=30,
                what=f"the scheduler worker to log {refusal!r}",
            )
        assert cluster.sql("SELECT status, error FROM scheduler_move WHERE id = %s", (move,)) == [("copying", "")]
    finally:
        cluster.sql("DELETE FROM scheduler_move WHERE id = %s", (move,))


# Run as the taken host: its Redis URL, from its own address. Each attempt is a Redis command; the answer is
# "denied: <why>" or what Redis answered.
REDIS_ATTEMPTS = r"""
import json, sys
import redis
url, attempts = sys.argv[1], json.loads(sys.argv[2])
client = redis.Redis.from_url(url, socket_timeout=10)
answers = {}
for name, command in attempts.items():
    try:
        answers[name] = repr(client.execute_command(*command))
    except redis.RedisError as exc:
        answers[name] = f"denied: {exc}"
print(json.dumps(answers))
"""


def test_a_taken_hosts_redis_user_reaches_only_its_own_queues(cluster):
    """h1's Redis user (core.redis_acl) from h1: no other host's queue, no read of the scheduler's, no flush, no
    other node's live group; its own agent still takes its queue (the suite's other tests run on it)."""
    url = agent_environ(cluster, 1)["REDIS_URL"]
    assert url.startswith("redis://node-h1:")
    work_history = f"gpucloud:{agent_environ(cluster, 1)['DEPLOYMENT_ID']}:monitor:workload"  # streams.py's names
    attempts = {
        "its own queue": ["LLEN", "node.h1"],
        "its own work's history": ["XADD", f"{work_history}:h1:1", "MAXLEN", "1", "*", "d", "{}"],
        "h2's queue": ["LRANGE", "node.h2", 0, -1],
        "h2's slow queue taken": ["RPOP", "node.h2.slow"],
        "h2's queue deleted": ["DEL", "node.h2"],
        "the scheduler's queue read": ["LRANGE", "scheduler", 0, -1],
        "everything flushed": ["FLUSHALL"],
        "every key listed": ["KEYS", "*"],
        "others' unacknowledged messages": ["HGETALL", "unacked"],
        "h2's live group": ["PUBLISH", "asgi__group__monitor.node.h2", "x"],
        "the charts of h2's work": ["PUBLISH", "asgi__group__monitor.workload.h2.1", "x"],
        "the history of h2's work": ["XADD", f"{work_history}:h2:1", "*", "d", "{}"],
        "a user's pages": ["PUBLISH", "asgi__group__user-1", "x"],
        "the control plane as Redis's administrator": ["AUTH", "default", "guess"],
    }
    answers = run_as_host(cluster, 1, REDIS_ATTEMPTS, url, attempts)
    assert not answers.pop("its own queue").startswith("denied"), answers
    assert not answers.pop("its own work's history").startswith("denied"), answers
    allowed = {name: answer for name, answer in answers.items() if not answer.startswith("denied")}
    assert not allowed, allowed


def test_a_taken_hosts_registry_login_pulls_the_catalog_and_pushes_over_none(cluster):
    """h1's own registry login (its agent's environment), through h1's engine: the token server lets it pull the
    catalog's image and not push over it (nor over any image it is not saving)."""
    env = agent_environ(cluster, 1)
    assert env["REGISTRY_USERNAME"] == "node-h1" and env["REGISTRY_TOKEN_REALM"]
    auth = {"username": env["REGISTRY_USERNAME"], "password": env["REGISTRY_PASSWORD"]}
    engine = cluster.engine(1)
    repository = f"{env['REGISTRY']}/gpucloud/busybox-standin"
    engine.images.pull(repository, tag="latest", auth_config=auth)  # raises if refused
    pushed = engine.api.push(repository, tag="latest", auth_config=auth, stream=True, decode=True)
    errors = [line["error"] for line in pushed if "error" in line]
    assert errors, "h1 pushed over the catalog's image"
    saved = f"{env['REGISTRY']}/gpucloud-saved/u1-i999999"
    engine.images.get(f"{repository}:latest").tag(saved, "x")
    pushed = engine.api.push(saved, tag="x", auth_config=auth, stream=True, decode=True)
    assert [line for line in pushed if "error" in line], "h1 pushed an image it is not saving"
