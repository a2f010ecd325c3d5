"""Give a GPU host its own Redis user (``core.redis_acl``): ``node-<name>``, limited to its own queues.

    python manage.py redis_host_user --host gpu1 --password-file /run/secrets/gpu1-redis
    printf %s "$PASSWORD" | python manage.py redis_host_user --host gpu1 --password-file -
    python manage.py redis_host_user --host gpu1 --remove

Run on the control plane (its ``REDIS_URL`` logs in as Redis's administrator). Only the password's SHA-256 is
sent to Redis; the host's ``REDIS_URL`` then names the user: ``redis://node-gpu1:<password>@<redis>:6379/0``.
Redis keeps the user for good where it keeps its users in a file (``aclfile``: docker-compose.yml's Redis does, and
the command saves it), else until it restarts.
"""

import hashlib

import redis
from django.core.management.base import BaseCommand, CommandError

from core.clients import redis_client
from core.messages import is_node_name
from core.password_files import first_line
from core.redis_acl import host_rules, username
from scheduler.telemetry import streams


class Command(BaseCommand):
    help = "Create (or replace, or --remove) a GPU host's own Redis user, limited to its own queues."

    def add_arguments(self, parser):
        parser.add_argument("--host", required=True, help="the node's name")
        parser.add_argument(
            "--password-file", help="a file holding the host's Redis password (first line); - reads it from stdin"
        )
        parser.add_argument("--remove", action="store_true", help="delete the host's user (its connections close)")

    def handle(self, *args, host, password_file, remove, **options):
        if not is_node_name(host):
            raise CommandError(f"--host: '{host}' is not a node name (letters, digits, '-' and '_')")
        client = redis_client()
        if remove:
            client.acl_deluser(username(host))
            self._save(client)
            self.stdout.write(f"Redis user {username(host)} removed")
            return
        if not password_file:
            raise CommandError("--password-file: name the file holding the host's Redis password")
        password = first_line(password_file)
        if len(password) < 16:
            raise CommandError(f"--password-file: {password_file} holds no password of 16 characters or more")
        node_stream = streams.node_stream(host)
        rules = host_rules(
            host,
            hashlib.sha256(password.encode()).hexdigest(),
            streams=[node_stream, streams.backfill_stream(node_stream)],
            workload_stream=streams.workload_stream,
        )
        client.execute_command("ACL", "SETUSER", username(host), *rules)
        self._save(client)
        self.stdout.write(f"Redis user {username(host)}: its own queues only")

    def _save(self, client) -> None:
        """ACL SAVE where Redis keeps its users in a file; elsewhere they last until Redis restarts."""
        try:
            client.execute_command("ACL", "SAVE")
        except redis.ResponseError as exc:
            if "ACL file" not in str(exc) and "aclfile" not in str(exc):
                raise
