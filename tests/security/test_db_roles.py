"""Least-privilege PostgreSQL roles, on the real PostgreSQL.

A node agent's role reads no users, password hashes, tokens or sessions; it updates only the columns
its agent owns, and only rows of its own node: another host's node row, cards, work, events, meter
segments, allocations and rollups are out of its reach, whatever SQL it sends. (That the agent's
whole lifecycle still runs on it: the fault suite's least-privilege test.)
"""

import psycopg
import pytest
from django.utils import timezone

from billing.models import MeterSegment
from scheduler.models import Allocation, GpuMinute, Node, Workload, WorkloadStatus
from tests.conftest import make_node, url_as

pytestmark = pytest.mark.django_db(transaction=True)

DENIED = psycopg.errors.InsufficientPrivilege  # SQLSTATE 42501: no grant, or a row-level policy refused the row


def running_on(node: Node, user) -> Workload:
    gpu = node.gpus.order_by("index").first()
    workload = Workload.objects.create(
        owner=user,
        kind="instance",
        name="w",
        image_ref="img",
        gpu_model=gpu.model,
        gpu_count=1,
        gpu_milli=1000,
        cpu_cores=1,
        memory_mb=512,
        disk_gb=1,
        node=node,
        status=WorkloadStatus.RUNNING,
    )
    Allocation.objects.create(workload=workload, gpu=gpu, milli=1000, memory_mb=1024)
    MeterSegment.objects.create(workload=workload, started_at=timezone.now())
    return workload


@pytest.fixture
def two_hosts(roles, user):
    """Host ``mine`` (connected as its own role) and host ``theirs``, each running one workload."""
    mine, theirs = make_node(), make_node()
    work = {"mine": running_on(mine, user), "theirs": running_on(theirs, user)}
    with psycopg.connect(url_as(roles.node(mine.name), "node-pw"), autocommit=True) as conn:
        yield conn, mine, theirs, work


@pytest.mark.parametrize("table", ["auth_user", "portal_apitoken", "django_session", "portal_idempotencykey"])
def test_the_node_role_cannot_read_users_tokens_or_sessions(roles, table):
    with psycopg.connect(url_as(roles.node("gpu1"), "node-pw")) as conn:
        with pytest.raises(DENIED):
            conn.execute(f"SELECT * FROM {table} LIMIT 1")


def test_the_node_role_reads_and_writes_what_an_agent_needs_and_cannot_change_the_schema(two_hosts, roles):
    conn, mine, _, work = two_hosts
    conn.execute("SELECT status FROM scheduler_workload LIMIT 1")
    assert conn.execute("UPDATE scheduler_node SET last_heartbeat = now() WHERE name = %s", [mine.name]).rowcount == 1
    stopped = conn.execute(
        "UPDATE scheduler_workload SET status = 'stopped', exit_code = 0 WHERE id = %s", [work["mine"].pk]
    )
    assert stopped.rowcount == 1
    with pytest.raises(DENIED):
        conn.execute("DELETE FROM scheduler_workload")
    with pytest.raises(DENIED):
        conn.execute("CREATE TABLE mischief (id int)")
    with psycopg.connect(url_as(roles.web, "web-pw")) as web:
        web.execute("SELECT count(*) FROM auth_user")
        # The web tier and the scheduler are not limited to one node's rows.
        assert web.execute("UPDATE scheduler_workload SET queue_position = NULL").rowcount == 2
        with pytest.raises(DENIED):
            web.execute("CREATE TABLE mischief (id int)")


def test_a_node_cannot_touch_another_nodes_rows(two_hosts):
    conn, _, theirs, work = two_hosts
    theirs_work = work["theirs"]
    writes = [
        ("UPDATE scheduler_workload SET status = 'failed' WHERE id = %s", [theirs_work.pk]),
        ("UPDATE scheduler_node SET last_heartbeat = now(), status = 'lost' WHERE id = %s", [theirs.pk]),
        ("UPDATE scheduler_gpu SET allocated_milli = 0 WHERE node_id = %s", [theirs.pk]),
        ("DELETE FROM scheduler_allocation WHERE workload_id = %s", [theirs_work.pk]),
        ("UPDATE billing_metersegment SET ended_at = now() WHERE workload_id = %s", [theirs_work.pk]),
    ]
    for statement, params in writes:
        assert conn.execute(statement, params).rowcount == 0, statement
    theirs_work.refresh_from_db()
    assert theirs_work.status == WorkloadStatus.RUNNING
    assert Allocation.objects.filter(workload=theirs_work).count() == 1
    assert MeterSegment.objects.get(workload=theirs_work).ended_at is None
    assert Node.objects.get(pk=theirs.pk).status == "active"


def test_a_node_cannot_write_rows_for_another_node(two_hosts):
    conn, mine, theirs, work = two_hosts
    inserts = [
        # Registering as another host, or as a new one.
        "INSERT INTO scheduler_node (name, hostname, address, relay_url, status, simulated, nvidia_runtime, "
        "cpu_cores, memory_mb, allocated_cpu, allocated_memory_mb, docker_version, registered_at, epoch) "
        "VALUES ('impostor', '', '', '', 'active', true, false, 1, 1, 0, 0, '', now(), 0)",
        # History and metering of another host's work: a forged event, a segment that bills it.
        f"INSERT INTO scheduler_workloadevent (workload_id, from_status, to_status, reason, created_at) "
        f"VALUES ({work['theirs'].pk}, 'running', 'stopped', 'forged', now())",
        f"INSERT INTO billing_metersegment (workload_id, started_at, end_reason, no_gpu) "
        f"VALUES ({work['theirs'].pk}, now() - interval '1 hour', '', false)",
        # Another host's card's rollups.
        f"INSERT INTO scheduler_gpuminute (gpu_id, minute, samples) "
        f"VALUES ({theirs.gpus.first().pk}, date_trunc('minute', now()), 1)",
    ]
    for statement in inserts:
        with pytest.raises(DENIED, match="row-level security"):
            conn.execute(statement)
    # Its own work cannot be handed to another host either.
    with pytest.raises(DENIED, match="row-level security"):
        conn.execute("UPDATE scheduler_workload SET pinned_node_id = %s WHERE id = %s", [theirs.pk, work["mine"].pk])
    assert not GpuMinute.objects.exists()
    assert not Node.objects.filter(name="impostor").exists()


@pytest.mark.parametrize(
    "column, value",
    [
        ("owner_id", None),  # whose work it is (and who pays)
        ("node_id", None),  # where it runs: the scheduler's to decide
        ("image_ref", "'evil:latest'"),
        ("disk_gb", "10000"),
        ("gpu_count", "8"),
        ("priority", "0"),
        ("attained_service", "0"),
    ],
)
def test_a_node_updates_only_the_columns_its_agent_owns_even_on_its_own_work(two_hosts, column, value):
    conn, _, _, work = two_hosts
    value = value or str(work["mine"].owner_id if column == "owner_id" else work["mine"].node_id)
    with pytest.raises(DENIED, match="permission denied"):
        conn.execute(f"UPDATE scheduler_workload SET {column} = {value} WHERE id = %s", [work["mine"].pk])


def test_a_node_cannot_rename_itself_or_take_the_web_roles_rights(two_hosts, roles):
    conn, mine, _, _ = two_hosts
    with pytest.raises(DENIED):
        conn.execute("UPDATE scheduler_node SET name = 'other' WHERE id = %s", [mine.pk])
    with pytest.raises(DENIED):
        conn.execute(f'SET ROLE "{roles.web}"')
    # The group role it belongs to names no node: acting as it gives fewer rights, not more.
    conn.execute(f'SET ROLE "{roles.prefix}_node"')
    assert conn.execute("UPDATE scheduler_node SET last_heartbeat = now()").rowcount == 0


def test_hosts_are_added_and_dropped_without_touching_the_others(roles):
    first, second = roles.node("gpu1"), roles.node("gpu2")
    roles.drop("gpu1")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url_as(first, "node-pw")).close()
    with psycopg.connect(url_as(second, "node-pw")) as conn:
        conn.execute("SELECT count(*) FROM scheduler_workload")
    with psycopg.connect(url_as(roles.web, "web-pw")) as conn:
        conn.execute("SELECT count(*) FROM auth_user")


def test_a_node_reads_the_code_of_its_own_jobs_only_and_writes_none(two_hosts):
    from scheduler.models import WorkloadCode

    conn, _, _, work = two_hosts
    for workload in work.values():
        WorkloadCode.objects.create(workload=workload, archive=b"tgz", size_bytes=3, sha256="0" * 64)
    readable = conn.execute("SELECT workload_id FROM scheduler_workloadcode").fetchall()
    assert readable == [(work["mine"].pk,)], "another host's tenants' code is out of its sight"
    with pytest.raises(DENIED):
        conn.execute("UPDATE scheduler_workloadcode SET archive = 'x'")


def test_a_node_reads_the_code_of_an_array_with_a_task_here_stored_with_another_task(two_hosts, user):
    """An array's code is stored once, with its first task: a host running another of its tasks reads it."""
    from scheduler.models import WorkloadCode, WorkloadGroup

    conn, mine, theirs, work = two_hosts
    sweep, other = WorkloadGroup.objects.create(name="sweep"), WorkloadGroup.objects.create(name="other")
    Workload.objects.filter(pk=work["mine"].pk).update(group=sweep)
    first = running_on(theirs, user)  # the array's first task, on the other host, holds the code
    Workload.objects.filter(pk=first.pk).update(group=sweep)
    elsewhere = running_on(theirs, user)  # another array's, none of this host's
    Workload.objects.filter(pk=elsewhere.pk).update(group=other)
    for workload in (first, elsewhere):
        WorkloadCode.objects.create(workload=workload, archive=b"tgz", size_bytes=3, sha256="0" * 64)
    readable = conn.execute("SELECT workload_id FROM scheduler_workloadcode").fetchall()
    assert readable == [(first.pk,)]


def test_a_node_records_runs_of_its_own_work_on_itself_only(two_hosts):
    from scheduler.models import WorkloadRun

    conn, mine, theirs, work = two_hosts
    insert = (
        "INSERT INTO scheduler_workloadrun (workload_id, number, node_id, node_name, started_at) "
        "VALUES (%s, %s, %s, %s, now())"
    )
    conn.execute("SELECT id FROM scheduler_workload WHERE id = %s FOR UPDATE", [work["mine"].pk])  # as the launch does
    conn.execute(insert, [work["mine"].pk, 1, mine.pk, mine.name])
    for workload, node in ((work["theirs"], theirs), (work["mine"], theirs), (work["theirs"], mine)):
        with pytest.raises(DENIED, match="row-level security"):
            conn.execute(insert, [workload.pk, 2, node.pk, node.name])
    assert list(WorkloadRun.objects.values_list("workload_id", "node_id")) == [(work["mine"].pk, mine.pk)]


def test_a_gangs_member_host_records_its_members_runs_on_itself_only_without_the_workloads_lock(two_hosts):
    """A gang's workload row is its rank 0's host's: the member's host numbers its run without locking it."""
    from scheduler.models import WorkloadMember, WorkloadRun

    conn, mine, theirs, work = two_hosts
    gang = work["theirs"]
    WorkloadMember.objects.create(workload=gang, rank=0, node=theirs, node_name=theirs.name)
    WorkloadMember.objects.create(workload=gang, rank=1, node=mine, node_name=mine.name)
    insert = (
        "INSERT INTO scheduler_workloadrun (workload_id, number, rank, node_id, node_name, started_at) "
        "VALUES (%s, %s, %s, %s, %s, now())"
    )
    conn.execute(insert, [gang.pk, 1, 1, mine.pk, mine.name])
    with pytest.raises(DENIED, match="row-level security"):
        conn.execute(insert, [gang.pk, 2, 0, theirs.pk, theirs.name])  # not on another host
    locked = conn.execute("SELECT id FROM scheduler_workload WHERE id = %s FOR UPDATE", [gang.pk]).fetchall()
    assert locked == []  # the row lock rank 0's host takes is not this host's to take
    assert list(WorkloadRun.objects.values_list("workload_id", "rank", "node_id")) == [(gang.pk, 1, mine.pk)]


def test_a_host_bills_only_what_it_runs_now_and_names_no_payer(two_hosts, user):
    """Issue 31 §1: on its own work, a host records a start and opens its meter segment only as the agent does —
    at the time it writes, for the cards the work was given, naming no payer or rate — and closes it once, never
    in the future. What it cannot do, each an attempt to charge the work's payer (or another account) for more."""
    from django.contrib.auth import get_user_model

    from billing.ledger import user_account

    conn, _, _, work = two_hosts
    mine = work["mine"].pk
    other = user_account(get_user_model().objects.create_user("payer", password="x" * 12))
    assert conn.execute("UPDATE billing_metersegment SET ended_at = now() WHERE workload_id = %s", [mine]).rowcount == 1
    event = (
        "INSERT INTO scheduler_workloadevent (workload_id, from_status, to_status, reason{}) VALUES (%s, %s, %s, ''{})"
    )
    segment = (
        "INSERT INTO billing_metersegment (workload_id, started_at, end_reason, no_gpu, spot, cards{}) "
        "VALUES (%s, %s, '', false, false, %s{})"
    )
    # As the agent does it: the start is recorded now, and the segment opens at it.
    (started,) = conn.execute(event.format("", "") + " RETURNING created_at", [mine, "stopped", "running"]).fetchone()
    conn.execute(segment.format("", ""), [mine, started, 1])
    # Its open segment cannot end in the future; once ended, it cannot be stretched (or reopened).
    close = "UPDATE billing_metersegment SET ended_at = {} WHERE workload_id = %s AND started_at = %s"
    with pytest.raises(DENIED, match="row-level security"):
        conn.execute(close.format("now() + interval '1 day'"), [mine, started])
    assert conn.execute(close.format("now()"), [mine, started]).rowcount == 1
    for reopened in ("now() + interval '1 day'", "NULL"):
        assert conn.execute(close.format(reopened), [mine, started]).rowcount == 0
    refused = [
        (event.format(", created_at", ", now() - interval '1 hour'"), [mine, "stopped", "running"]),  # back-dated
        (event.format(", created_at, meter", ", now() - interval '1 hour', 'resume'"), [mine, "running", "running"]),
        (event.format(", created_at", ", now() + interval '1 day'"), [mine, "running", "stopped"]),  # future
        (segment.format(", account_id", ", %s"), [mine, started, 1, other.pk]),  # a payer of its choosing
        (segment.format("", ""), [mine, started - timezone.timedelta(hours=1), 1]),  # no start then
        (segment.format("", ""), [mine, started, 8]),  # more cards than it was given
    ]
    for statement, params in refused:
        with pytest.raises(DENIED, match="row-level security"):
            conn.execute(statement, params)
    assert not MeterSegment.objects.filter(workload_id=mine, account__isnull=False).exists()
    assert not MeterSegment.objects.filter(workload_id=mine, ended_at__gt=timezone.now()).exists()
    assert MeterSegment.objects.filter(workload_id=mine).count() == 2  # the fixture's and the agent-like one
    # An end dated back (the container stopped before the agent saw it) is the agent's to record.
    conn.execute(event.format(", created_at", ", now() - interval '5 seconds'"), [mine, "running", "stopped"])


def test_a_host_keeps_the_address_it_registered_with(two_hosts, roles):
    """Relay calls go to a host's registered address: a host that could move it would send the web tier and the
    other hosts wherever it chose (a cloud's metadata service). Once set, only an operator (the web role) moves it."""
    conn, mine, _, _ = two_hosts
    at = "UPDATE scheduler_node SET address = %s, last_heartbeat = now() WHERE name = %s"
    assert Node.objects.get(pk=mine.pk).address == ""
    assert conn.execute(at, ["10.0.0.11", mine.name]).rowcount == 1  # the first registration sets it
    assert conn.execute(at, ["10.0.0.11", mine.name]).rowcount == 1  # kept: every later start
    for elsewhere in ("169.254.169.254", "", "10.0.0.12"):
        with pytest.raises(DENIED, match="row-level security"):
            conn.execute(at, [elsewhere, mine.name])
    assert Node.objects.get(pk=mine.pk).address == "10.0.0.11"
    with psycopg.connect(url_as(roles.web, "web-pw"), autocommit=True) as web:
        assert web.execute(at, ["10.0.0.21", mine.name]).rowcount == 1  # an operator re-addresses a host
    assert Node.objects.get(pk=mine.pk).address == "10.0.0.21"


def test_a_host_reads_what_its_own_work_runs_and_its_environment_only(two_hosts):
    """A workload's command and environment (API keys live there) are for its own host (and a gang member's)."""
    from scheduler.models import WorkloadSpec

    conn, _, _, work = two_hosts
    for workload in work.values():
        WorkloadSpec.objects.create(workload=workload, command=["train"], env={"HF_TOKEN": f"hf_{workload.pk}"})
    readable = conn.execute("SELECT workload_id, env FROM scheduler_workloadspec").fetchall()
    assert readable == [(work["mine"].pk, {"HF_TOKEN": f"hf_{work['mine'].pk}"})]
    with pytest.raises(DENIED):
        conn.execute("UPDATE scheduler_workloadspec SET command = '[]'")


def test_a_host_cut_off_inside_a_transaction_holds_its_works_rows_no_longer_than_the_limit(roles, user):
    """An agent's transaction locks its work's row (a status change). A host cut off before its COMMIT leaves the
    session idle in it, and the server hears nothing more: after NODE_DB_IDLE_TX_S it ends the session, so the
    control plane's settling of the lost host's work waits that long, not until TCP gives up on the host."""
    roles.idle_tx_s = 1
    mine = make_node()
    work = running_on(mine, user)
    lost = psycopg.connect(url_as(roles.node(mine.name), "node-pw"))  # its role made with the limit
    try:
        assert lost.execute("SELECT id FROM scheduler_workload WHERE id = %s FOR UPDATE", [work.pk]).fetchone()
        with psycopg.connect(url_as(roles.web, "web-pw"), autocommit=True) as web:
            web.execute("SET lock_timeout = '20s'")  # hours without the limit
            requeued = web.execute("UPDATE scheduler_workload SET status = 'queued' WHERE id = %s", [work.pk])
            assert requeued.rowcount == 1
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            lost.execute("SELECT 1")
    finally:
        lost.close()
