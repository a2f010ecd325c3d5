"""Give a GPU host its own Redis user (``core.redis_acl``): ``node-<name>``, limited to its own queues.

    python manage.py redis_host_user --host gpu1 --password-file /run/secrets/gpu1-redis
    printf %s "$PASSWORD" | python manage.py redis_host_user --host gpu1 --password-file -
    python manage.py redis_host_user --host gpu1 --remove

Run on the control plane (its ``REDIS_URL`` logs in as Redis's administrator). Only the password's SHA-256 is
sent to Redis; the host's ``REDIS_URL`` then names the user:
``rediss://node-gpu1:<password>@<redis>:6379/0?ssl_cert_reqs=required&ssl_ca_certs=<CA>`` (the production
stack publishes Redis to the GPU servers over TLS only).
Redis keeps the user for good where it keeps its users in a file (``aclfile``: docker-compose.yml's Redis does, and
the command saves it), else until it restarts.
"""

import redis

from core.clients import redis_client
from core.host_logins import HostLoginCommand
from core.redis_acl import host_rules, username
from scheduler.telemetry import streams


class Command(HostLoginCommand):
    help = "Create (or replace, or --remove) a GPU host's own Redis user, limited to its own queues."
    service = "Redis"
    remove_help = "delete the host's user (its connections close)"

    def login_remove(self, host: str) -> None:
        client = redis_client()
        client.acl_deluser(username(host))
        self._save(client)
        self.stdout.write(f"Redis user {username(host)} removed")

    def login_set(self, host: str, sha256: str) -> None:
        client = redis_client()
        node_stream = streams.node_stream(host)
        rules = host_rules(
            host,
            sha256,
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
