"""A GPU host's own Redis user (core.redis_acl, manage.py redis_host_user) on the real Redis: its own queues, a
write-only way to the scheduler's, its own node's live group and history, nothing of anyone else's."""

import secrets

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import CommandError
from kombu import Connection

from config.celery import app
from core.messages import node_queue, workload_group
from core.redis_acl import SEP, unacked_keys, username
from scheduler.telemetry import streams

DENIED = redis.exceptions.NoPermissionError


@pytest.fixture
def host(tmp_path):
    """A host with its own Redis user (a name of this test's own: users are the Redis server's, not a database's)."""
    name = "t" + secrets.token_hex(4)
    password = tmp_path / "redis.password"
    password.write_text(secrets.token_hex(24) + "\n")
    call_command("redis_host_user", host=name, password_file=str(password))
    url = redis.connection.parse_url(settings.REDIS_URL)
    client = redis.Redis(
        host=url.get("host", "127.0.0.1"),
        port=url.get("port", 6379),
        db=url.get("db", 0),
        username=username(name),
        password=password.read_text().strip(),
    )
    admin = redis.Redis.from_url(settings.REDIS_URL)
    yield name, client, password
    stream = streams.workload_stream(name, 5)
    admin.delete(node_queue(name), node_queue(name) + SEP + "3", *unacked_keys(name).values())
    admin.delete(streams.node_stream(name), stream, streams.backfill_stream(stream))
    admin.acl_deluser(username(name))


def test_a_host_uses_its_own_queues_and_streams_and_nothing_else(host):
    name, as_host, _ = host
    admin = redis.Redis.from_url(settings.REDIS_URL)
    own = node_queue(name)
    assert as_host.lpush(own, "a") == 1 and as_host.lpush(own + SEP + "3", "b") == 1  # each priority step's list
    assert as_host.rpop(own) == b"a"
    assert as_host.hset(unacked_keys(name)["unacked_key"], "tag", "m") == 1
    queued = admin.llen(settings.SCHEDULER_QUEUE)
    assert as_host.lpush(settings.SCHEDULER_QUEUE, "reply") == queued + 1  # its replies: pushed, never read back
    assert admin.lpop(settings.SCHEDULER_QUEUE) == b"reply"
    assert as_host.publish("asgi__group__monitor.node." + name, "sample") == 0
    assert as_host.xadd(streams.node_stream(name), {"d": "{}"})
    assert as_host.publish("asgi__group__" + workload_group(name, 5), "sample") == 0  # its work's charts
    assert as_host.xadd(streams.workload_stream(name, 5), {"d": "{}"})
    assert as_host.xadd(streams.backfill_stream(streams.workload_stream(name, 5)), {"d": "{}"})
    refused = {
        "a name that starts with its own": lambda: as_host.lpush(own + "0", "x"),
        "another host's queue": lambda: as_host.lrange(node_queue("other"), 0, -1),
        "another host's slow queue": lambda: as_host.delete(node_queue("other", slow=True)),
        "the unacknowledged messages of others": lambda: as_host.hgetall("unacked"),
        "reading the scheduler's queue": lambda: as_host.lrange(settings.SCHEDULER_QUEUE, 0, -1),
        "taking from it": lambda: as_host.rpop(settings.SCHEDULER_QUEUE),
        "binding a queue to the scheduler's exchange": lambda: as_host.sadd("_kombu.binding.scheduler", "x"),
        "flushing": lambda: as_host.flushall(),
        "listing keys": lambda: as_host.keys("*"),
        "the configuration": lambda: as_host.config_get("*"),
        "another node's live group": lambda: as_host.publish("asgi__group__monitor.node.other", "x"),
        "a user's pages": lambda: as_host.publish("asgi__group__user-1", "x"),
        "another node's history": lambda: as_host.xadd(streams.node_stream("other"), {"d": "{}"}),
        "the charts of work on another host": lambda: as_host.publish("asgi__group__" + workload_group("o", 5), "x"),
        "of a host whose name starts with its own": lambda: as_host.publish(
            "asgi__group__" + workload_group(name + "0", 5), "x"
        ),
        "the history of work on another host": lambda: as_host.xadd(streams.workload_stream("o", 5), {"d": "{}"}),
        "the web tier's cache": lambda: as_host.get(cache.make_key("anything")),
    }
    for what, attempt in refused.items():
        with pytest.raises(DENIED):
            attempt()
            pytest.fail(f"{what}: allowed")


def test_a_host_consumes_its_queue_and_replies_as_celery_does(host):
    """Kombu's own paths under the user: declare and take from its queue with its unacknowledged messages in its own
    keys, acknowledge; and a reply sent to the scheduler as core.messages sends it (no declaring)."""
    name, as_host, password = host
    url = redis.connection.parse_url(settings.REDIS_URL)
    host_url = f"redis://{username(name)}:{password.read_text().strip()}@{url['host']}:{url['port']}/{url['db']}"
    admin = redis.Redis.from_url(settings.REDIS_URL)
    queued = admin.llen(settings.SCHEDULER_QUEUE)
    with Connection(settings.REDIS_URL) as control_plane:
        control_plane.SimpleQueue(node_queue(name)).put({"launch": 1})
    with Connection(host_url, transport_options=unacked_keys(name)) as connection:
        queue = connection.SimpleQueue(node_queue(name))
        message = queue.get(timeout=5)
        assert message.payload == {"launch": 1}
        assert admin.hlen(unacked_keys(name)["unacked_key"]) == 1  # held in its own keys until acknowledged
        message.ack()
        assert admin.hlen(unacked_keys(name)["unacked_key"]) == 0
        queue.close()
        app.send_task(
            "scheduler.tasks.schedule_tick", queue=settings.SCHEDULER_QUEUE, declare=[], connection=connection
        )
    assert admin.llen(settings.SCHEDULER_QUEUE) == queued + 1
    assert b"schedule_tick" in admin.lpop(settings.SCHEDULER_QUEUE)


def test_the_command_refuses_a_bad_name_or_password_and_removes_a_user(host, tmp_path):
    name, as_host, _ = host
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(CommandError, match="no password of 16"):
        call_command("redis_host_user", host=name, password_file=str(short))
    with pytest.raises(CommandError, match="not a node name"):
        call_command("redis_host_user", host="a b", password_file=str(short))
    call_command("redis_host_user", host=name, remove=True)
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_host.ping()
