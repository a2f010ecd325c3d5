"""Grant the PostgreSQL roles each part of the platform logs in as the least privilege it needs.

- ``<prefix>_web``: the web and WebSocket servers and the scheduler worker / beat: reads and
  writes every application table, and nothing else (no DDL: migrations run as the database owner).
- ``<prefix>_node_<name>``: the node agent of GPU host ``<name>``, one login role per host. The
  hosts run tenants' containers, so a host is trusted with its own work only: through the group
  role ``<prefix>_node`` (no login) every host may read the cluster tables (never users, password
  hashes, API tokens, sessions or idempotency records), and may write only

  * the columns its agent owns (column-level UPDATE grants: a workload's status, container, exit
    code … never its owner, image, command, size, node or price), and
  * the rows of its own node (row-level security): its node row, its cards, the work placed on it
    (or pinned to it while stopped), that work's events, runs and meter segments, its cards' allocations
    and minute rollups, and
  * of what it bills, only what it saw: a meter segment names no payer or rate (the control plane's), holds
    the cards its work was given, starts at an event that started the meter, recorded when it was written
    (never back-dated), and ends once, never in the future (``EVENT_TIME``, ``SEGMENT_OPENED``).

  Which node a session is comes from the role it logged in as (``current_user``), which the
  session cannot change: a host holding its own password cannot act as another host. A host's
  session left idle inside a transaction for ``NODE_DB_IDLE_TX_S`` is ended by the server (the
  host was cut off mid-transaction: its locks go with it).

    python manage.py db_roles --prefix gpucloud

It makes no role: the database server's superuser makes the login roles, with their passwords and the
idle-in-transaction limit, and adds or takes away a host's (``config/prod/images/postgres-roles.sh``: the
production stack's postgres runs it at every start; the tests and ``make cluster`` run the same script), so no
role the platform logs in as needs CREATEROLE. A host's role made later needs no new grant: it takes the group's.

Run it as the database owner after every ``migrate`` (grants cover the tables that exist); it is
idempotent (grants and policies are re-applied). Point each part's DATABASE_URL at its role: the web
tier at ``<prefix>_web``, host ``<name>``'s agent at ``<prefix>_node_<name>`` with NODE_NAME=<name>.
"""

from dataclasses import dataclass

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from psycopg import sql

from billing.models import MeterSegment
from portal.models import Image, Instance
from scheduler.models import (
    Allocation,
    Gpu,
    GpuMinute,
    Move,
    Node,
    Workload,
    WorkloadCode,
    WorkloadEvent,
    WorkloadGpuMinute,
    WorkloadMember,
    WorkloadRun,
    WorkloadSpec,
)

# The id of the node the session's role belongs to: {own} in the row rules below.
OWN_NODE = "(SELECT n.id FROM scheduler_node n WHERE n.name = {name})"
# Work belongs to the node it is placed on, or, while it holds no node, to the one it is pinned to
# (a stopped instance's disk, a preempted job's checkpoint): what the agent settles and releases.
OWN_WORK = "(SELECT w.id FROM scheduler_workload w WHERE coalesce(w.node_id, w.pinned_node_id) = {own})"
OWN_CARDS = "(SELECT g.id FROM scheduler_gpu g WHERE g.node_id = {own})"
# Gangs with a member on the node: it launches that member (reading the gang's code), nothing more.
MEMBER_OF = "(SELECT m.workload_id FROM scheduler_workloadmember m WHERE m.node_id = {own})"
# The tasks of the arrays with a task here: an array's code is stored once, with its first task.
SAME_ARRAY = (
    "(SELECT t.id FROM scheduler_workload t JOIN scheduler_workload w ON t.group_id = w.group_id"
    " WHERE coalesce(w.node_id, w.pinned_node_id) = {own})"
)


# What a host bills (issue 31 §1). An event that starts the meter (a start, a resume) is recorded at the time it
# is written: a host cannot back-date a start, nor date anything in the future (it may date an end back, to when
# the container really stopped: the meter then stops sooner, never later).
def opens_meter(event: str = "") -> str:
    """Whether the event row (its columns, or those of alias ``event``) started its work's meter."""
    e = f"{event}." if event else ""
    return f"({e}to_status = 'running' AND ({e}from_status <> 'running' OR {e}meter = 'resume'))"


EVENT_TIME = (
    "created_at <= statement_timestamp() AND (NOT " + opens_meter() + " OR created_at >= transaction_timestamp())"
)
# A meter segment a host opens names no payer, rate or settlement (the control plane assigns them), holds the
# cards, price kind and spot-ness of its work as the scheduler recorded them, and starts at an event that started
# its work's meter; it closes it once (an ended segment is not its to reopen or stretch), never in the future.
SEGMENT_OPENED = (
    "account_id IS NULL AND rate_card_id IS NULL AND settled_until IS NULL AND ended_at IS NULL"
    " AND EXISTS (SELECT 1 FROM scheduler_workload w WHERE w.id = billing_metersegment.workload_id"
    " AND w.gpu_count IS NOT DISTINCT FROM billing_metersegment.cards AND w.no_gpu = billing_metersegment.no_gpu"
    " AND w.spot = billing_metersegment.spot)"
    " AND billing_metersegment.started_at IN (SELECT e.created_at FROM scheduler_workloadevent e"
    " WHERE e.workload_id = billing_metersegment.workload_id AND " + opens_meter("e") + ")"
)


# A host keeps the address it registered with: the web tier and the other hosts call its relay there (a relay
# URL must name it), so a host that could move it would send them anywhere (a cloud's metadata service). In an
# UPDATE's check, a subquery still sees the row as it was before the command. An operator changes it (web role).
ADDRESS_KEPT = "(SELECT n.address FROM scheduler_node n WHERE n.id = scheduler_node.id) IN ('', scheduler_node.address)"


@dataclass(frozen=True)
class NodeAccess:
    """What a node agent does to one table: table privileges, the columns it updates, and which rows
    it may write (a SQL condition; ``check`` for the new version of a row, when it is stricter).

    ``inserted``: what a row it inserts must also be; ``updatable``: which of ``rows`` it may update;
    ``updated``: what a row it updated must also be (each ANDed to the rest)."""

    privileges: str
    update: tuple[str, ...] = ()
    rows: str = ""
    check: str = ""
    read_own: bool = False  # it reads only ``rows`` too (tenants' data it needs for its own work alone)
    inserted: str = ""
    updatable: str = ""
    updated: str = ""


# What a node agent's process does to each table (agent/*, scheduler/services/nodes.py and
# lifecycle.py that it calls, and the lifecycle receivers that run in it: billing's metering, the
# portal's live push). A column a new agent code path updates must be added here: the fault suite's
# lifecycle test runs the agent on this role.
NODE_ACCESS = {
    Node: NodeAccess(
        "SELECT, INSERT",  # registration (its own row only), heartbeats, epochs, rejoining, freed capacity
        update=(
            "hostname",
            "address",
            "relay_url",
            "relay_tls_sha256",
            "status",
            "simulated",
            "nvidia_runtime",
            "cpu_cores",
            "memory_mb",
            "allocated_cpu",
            "allocated_memory_mb",
            "docker_version",
            "last_heartbeat",
            "disk_gb",
            "disk_total_gb",
            "disk_free_gb",
            "epoch",
            "drain_deadline",  # cleared when its agent registers it again
            # Django's update_or_create rewrites every field with its own pre_save (dates), unchanged.
            "registered_at",
        ),
        rows="name = {name}",
        updated=ADDRESS_KEPT,
    ),
    Gpu: NodeAccess(
        "SELECT, INSERT, DELETE",  # the host's cards, as NVML (or the spec) reports them
        update=("node_id", "index", "model", "memory_mb", "allocated_milli", "allocated_memory_mb"),
        rows="node_id = {own}",
    ),
    Workload: NodeAccess(
        "SELECT",  # transitions (compare-and-swap) and measured utilization
        update=(
            "status",
            "status_reason",
            "status_changed_at",
            "container_id",
            "ports",
            "exit_code",
            "started_at",
            "finished_at",
            "queued_at",
            "pinned_node_id",
            "preempt_requested",
            "preemptions",
            "restarting",  # a restart's claim, ended by the node once the container runs again
            "log_tail",
            "gpu_utilization",
        ),
        rows="coalesce(node_id, pinned_node_id) = {own}",
        # After the write it still belongs to this node alone: it cannot be handed to another one.
        check="coalesce(node_id, pinned_node_id) = {own} AND coalesce(pinned_node_id, node_id) = {own}",
    ),
    Allocation: NodeAccess("SELECT, DELETE", rows="gpu_id IN " + OWN_CARDS),  # freed when work leaves a holding state
    WorkloadEvent: NodeAccess("SELECT, INSERT", rows="workload_id IN " + OWN_WORK, inserted=EVENT_TIME),
    # Each start of its work's containers, a gang's member's here included (where that piece of the work's
    # log lives): on this node only.
    WorkloadRun: NodeAccess(
        "SELECT, INSERT",
        rows="workload_id IN " + OWN_WORK + " OR workload_id IN " + MEMBER_OF,
        check="(workload_id IN " + OWN_WORK + " OR workload_id IN " + MEMBER_OF + ") AND node_id = {own}",
    ),
    MeterSegment: NodeAccess(
        "SELECT, INSERT",
        update=("ended_at", "end_reason"),
        rows="workload_id IN " + OWN_WORK,
        inserted=SEGMENT_OPENED,
        updatable="ended_at IS NULL",
        updated="ended_at <= statement_timestamp()",
    ),
    Instance: NodeAccess("SELECT"),
    Image: NodeAccess("SELECT"),  # a host removes an image from its engine only while it is being deleted
    Move: NodeAccess("SELECT"),  # a move's source and target read it; the control plane writes it
    # What a workload runs and its environment (API keys): its own host's only, a gang member's host's too.
    WorkloadSpec: NodeAccess(
        "SELECT", rows="workload_id IN " + OWN_WORK + " OR workload_id IN " + MEMBER_OF, read_own=True
    ),
    # A job's code, extracted into its container at launch: the host of that job's only (of a task of its array's).
    WorkloadCode: NodeAccess(
        "SELECT",
        rows="workload_id IN " + OWN_WORK + " OR workload_id IN " + MEMBER_OF + " OR workload_id IN " + SAME_ARRAY,
        read_own=True,
    ),
    # A gang's member on this node: its container's state, written by this node's agent only.
    WorkloadMember: NodeAccess(
        "SELECT",
        update=("status", "container_id", "address", "exit_code", "reason", "changed_at"),
        rows="node_id = {own}",
    ),
    # Minute rollups, upserted (an agent restarted mid-minute).
    GpuMinute: NodeAccess("SELECT, INSERT", update=GpuMinute.VALUES, rows="gpu_id IN " + OWN_CARDS),
    WorkloadGpuMinute: NodeAccess("SELECT, INSERT", update=GpuMinute.VALUES, rows="gpu_id IN " + OWN_CARDS),
}


def node_role(prefix: str, node_name: str) -> str:
    return f"{prefix}_node_{node_name}"


class Command(BaseCommand):
    help = "Grant the least-privilege PostgreSQL roles (made by postgres-roles.sh) their tables, columns and rows."

    def add_arguments(self, parser):
        parser.add_argument("--prefix", default="gpucloud")

    def handle(self, *args, prefix, **options):
        if connection.vendor != "postgresql":
            raise CommandError("roles are a PostgreSQL feature: point DATABASE_URL at the PostgreSQL database")
        web, group = f"{prefix}_web", f"{prefix}_node"
        database = sql.Identifier(connection.settings_dict["NAME"])
        with connection.cursor() as cursor:
            missing = [role for role in (web, group) if not self._exists(cursor, role)]
            if missing:
                raise CommandError(
                    f"role {' and '.join(missing)} does not exist yet: the database server's superuser makes the "
                    "login roles (config/prod/images/postgres-roles.sh, from DB_WEB_PASSWORD and DB_NODE_ROLES; the "
                    "production stack's postgres runs it at every start), then this grants them their tables"
                )
            for role in (web, group):
                cursor.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, sql.Identifier(role)))
                cursor.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(role)))
            tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
            self._grant_web(cursor, web, tables)
            self._grant_nodes(cursor, prefix, web, group, tables)
            cursor.execute(
                "SELECT r.rolname FROM pg_roles r JOIN pg_auth_members m ON m.member = r.oid "
                "JOIN pg_roles g ON g.oid = m.roleid WHERE g.rolname = %s AND r.rolcanlogin ORDER BY 1",
                [group],
            )
            members = [row[0] for row in cursor.fetchall()]
        self.stdout.write(
            f"roles granted: {web} (all application tables); {group} ({len(NODE_ACCESS)} tables, own rows only) "
            f"for {', '.join(members) or 'no host yet'}"
        )

    @staticmethod
    def _exists(cursor, role: str) -> bool:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        return cursor.fetchone() is not None

    @staticmethod
    def _grant_web(cursor, web: str, tables: list[str]) -> None:
        for table in tables:
            cursor.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                    sql.Identifier(table), sql.Identifier(web)
                )
            )
        cursor.execute(
            sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(sql.Identifier(web))
        )

    @staticmethod
    def _grant_nodes(cursor, prefix: str, web: str, group: str, tables: list[str]) -> None:
        """Table and column grants, and the row-level security policies, of the node group role."""
        role = sql.Identifier(group)
        # The node a session is: its login role's name, past "<prefix>_node_".
        name = f"substr(current_user, {len(node_role(prefix, '')) + 1})"
        own = OWN_NODE.format(name=name)
        granted = {model._meta.db_table for model in NODE_ACCESS}
        for table in tables:
            if table not in granted:
                cursor.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.Identifier(table), role))
        for model, access in NODE_ACCESS.items():
            # Each table's grants and policies are replaced in a transaction of its own: an agent at work
            # meanwhile (another host being added) never sees the table without them, and no lock is held
            # on one table while another's is taken (an agent's query would deadlock on that).
            with transaction.atomic():
                Command._grant_node_table(cursor, model, access, role, web, group, name, own)

    @staticmethod
    def _grant_node_table(cursor, model, access, role, web: str, group: str, name: str, own: str) -> None:
        table = sql.Identifier(model._meta.db_table)
        cursor.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(table, role))
        cursor.execute(sql.SQL("GRANT " + access.privileges + " ON {} TO {}").format(table, role))
        if access.update:
            columns = sql.SQL(", ").join(sql.Identifier(c) for c in access.update)
            cursor.execute(sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(columns, table, role))
        if "INSERT" in access.privileges:
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [model._meta.db_table])
            sequence = cursor.fetchone()[0]
            cursor.execute(sql.SQL("GRANT USAGE, SELECT ON SEQUENCE " + sequence + " TO {}").format(role))
        if not access.rows:
            return
        rows = sql.SQL(access.rows.format(name=name, own=own))
        check = sql.SQL((access.check or access.rows).format(name=name, own=own))
        writes = [p.strip() for p in access.privileges.split(",") if p.strip() != "SELECT"]
        writes += ["UPDATE"] if access.update else []
        policies = {
            f"{group}_read": sql.SQL("FOR SELECT TO {} USING ({})").format(
                role, rows if access.read_own else sql.SQL("true")
            ),
            f"{web}_all": sql.SQL("FOR ALL TO {} USING (true) WITH CHECK (true)").format(sql.Identifier(web)),
        }

        def also(condition, extra: str):
            return sql.SQL("({}) AND ({})").format(condition, sql.SQL(extra)) if extra else condition

        for command in writes:
            clause = {
                "INSERT": sql.SQL("WITH CHECK ({})").format(also(check, access.inserted)),
                "UPDATE": sql.SQL("USING ({}) WITH CHECK ({})").format(
                    also(rows, access.updatable), also(check, access.updated)
                ),
                "DELETE": sql.SQL("USING ({})").format(rows),
            }[command]
            policies[f"{group}_{command.lower()}"] = sql.SQL("FOR " + command + " TO {} {}").format(role, clause)
        for policy, body in policies.items():
            cursor.execute(sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(sql.Identifier(policy), table))
            cursor.execute(sql.SQL("CREATE POLICY {} ON {} ").format(sql.Identifier(policy), table) + body)
        # The owner (migrations, this command) is not subject to it; every other role needs a policy.
        cursor.execute(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table))
