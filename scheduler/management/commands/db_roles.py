"""Create the PostgreSQL roles each part of the platform logs in as, with the least privilege it needs.

- ``<prefix>_web``: the web servers and the scheduler worker / beat: reads and writes every
  application table, and nothing else (no DDL: migrations run as the database owner).
- ``<prefix>_node``: the node agents on the GPU hosts (trusted infrastructure, but the hosts
  that run tenants' containers): the cluster tables they converge, the metering rows their
  lifecycle receivers write, the instance ids their live push reads. Never users, password
  hashes, API tokens, sessions or idempotency records.

    python manage.py db_roles --prefix gpucloud --web-password ... --node-password ...

Run it as the database owner after ``migrate``; it is idempotent (GRANTs are re-applied,
passwords updated). Point each part's DATABASE_URL at its role.
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from psycopg import sql

from billing.models import MeterSegment
from portal.models import Instance
from scheduler.models import Allocation, Gpu, GpuMinute, Node, Workload, WorkloadEvent, WorkloadGpuMinute

# What a node agent's process does to each table (scheduler/node/*, and the lifecycle receivers
# that run in it: billing's metering and the portal's live push).
NODE_GRANTS = {
    Node: "SELECT, INSERT, UPDATE",  # registration, heartbeats, epochs, rejoining
    Gpu: "SELECT, INSERT, UPDATE, DELETE",  # the host's cards, as NVML (or the spec) reports them
    Workload: "SELECT, UPDATE",  # transitions (compare-and-swap) and measured utilization
    Allocation: "SELECT, DELETE",  # freed when work leaves a holding state
    WorkloadEvent: "SELECT, INSERT",
    MeterSegment: "SELECT, INSERT, UPDATE",
    Instance: "SELECT",
    GpuMinute: "SELECT, INSERT, UPDATE",  # minute rollups (upserted: an agent restarted mid-minute)
    WorkloadGpuMinute: "SELECT, INSERT, UPDATE",
}


class Command(BaseCommand):
    help = "Create or update the least-privilege PostgreSQL roles: <prefix>_web and <prefix>_node."

    def add_arguments(self, parser):
        parser.add_argument("--prefix", default="gpucloud")
        parser.add_argument("--web-password", required=True)
        parser.add_argument("--node-password", required=True)

    def handle(self, *args, prefix, web_password, node_password, **options):
        if connection.vendor != "postgresql":
            raise CommandError("roles are a PostgreSQL feature: point DATABASE_URL at the PostgreSQL database")
        web, node = f"{prefix}_web", f"{prefix}_node"
        database = sql.Identifier(connection.settings_dict["NAME"])
        with connection.cursor() as cursor:
            for role, password in ((web, web_password), (node, node_password)):
                cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
                verb = "ALTER" if cursor.fetchone() else "CREATE"
                cursor.execute(
                    sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password))
                )
                cursor.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, sql.Identifier(role)))
                cursor.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(role)))
            tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
            for table in tables:
                cursor.execute(
                    sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                        sql.Identifier(table), sql.Identifier(web)
                    )
                )
            cursor.execute(
                sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(sql.Identifier(web))
            )
            for table in tables:
                cursor.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.Identifier(table), sql.Identifier(node)))
            for model, privileges in NODE_GRANTS.items():
                table = sql.Identifier(model._meta.db_table)
                cursor.execute(sql.SQL("GRANT " + privileges + " ON {} TO {}").format(table, sql.Identifier(node)))
                if "INSERT" in privileges:
                    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [model._meta.db_table])
                    sequence = cursor.fetchone()[0]
                    cursor.execute(
                        sql.SQL("GRANT USAGE, SELECT ON SEQUENCE " + sequence + " TO {}").format(sql.Identifier(node))
                    )
        self.stdout.write(f"roles ready: {web} (all application tables), {node} ({len(NODE_GRANTS)} tables)")
