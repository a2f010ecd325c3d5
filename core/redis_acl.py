"""What a GPU host may do in Redis: an ACL user of its own, limited to its own queues and what it publishes.

Every host used to share the control plane's Redis password: it could read, take or delete any other host's
queue (a launch, a move's capability), flush the database, or publish to any group. Each host now logs in as
``node-<name>`` (``manage.py redis_host_user``), which may:

- take from and push to its own queues only: ``node.<name>`` and ``node.<name>.slow`` (Celery's Redis transport
  keeps a list per queue and per priority step, ``<queue>\\x06\\x16<step>``), and declare them (its workers add
  the queue to ``_kombu.binding.<queue>`` and ``_kombu.binding_permanent.<queue>`` when they start);
- keep its unacknowledged messages in keys of its own (``unacked.<name>``, ``unacked_index.<name>``,
  ``unacked_mutex.<name>``: the settings give a process with a ``NODE_NAME`` these transport options);
- push to the scheduler's queue and never read it (Redis 7's write-only key permission): what it sends there is
  signed with its own key and checked by the control plane (``core.signing``);
- append to its node's live history stream and to its own workloads' (``scheduler.telemetry.streams``), and
  publish to its node's group and to its workloads' groups (the sampler's documents). A workload's stream and group
  are named by host and id (``monitor.workload.<name>.<id>``): a host writes no sample into the charts of work on
  another host; the instance monitor watches the host its instance is on and follows it when it moves. Not to
  users' groups: an instance's status change on a host is pushed by the control plane
  (``ToScheduler.INSTANCE_STATUS_PUSH``);
- no command of Redis's ``@dangerous`` category (``FLUSHALL``, ``KEYS``, ``CONFIG``, ``MONITOR``, ``DEBUG`` ...).
"""

from django.conf import settings

SEP = "\x06\x16"  # kombu's Redis transport: a queue's list for a priority step is "<queue><SEP><step>"
USER_PREFIX = "node-"


def username(node_name: str) -> str:
    return USER_PREFIX + node_name


def unacked_keys(node_name: str) -> dict[str, str]:
    """The transport options that keep a host's unacknowledged messages in keys of its own."""
    return {
        "unacked_key": f"unacked.{node_name}",
        "unacked_index_key": f"unacked_index.{node_name}",
        "unacked_mutex_key": f"unacked_mutex.{node_name}",
    }


def _any(node_name: str, name_of) -> str:
    """A pattern for every name ``name_of(node_name, id)`` gives (the id last, after a separator)."""
    return name_of(node_name, 0).removesuffix("0") + "*"


def host_rules(node_name: str, password_sha256: str, *, streams: list[str], workload_stream) -> list[str]:
    """``ACL SETUSER node-<name>``'s rules for host ``node_name`` logging in with the password of that SHA-256.
    ``streams``: its node's live history keys; ``workload_stream(name, id)``: a workload's history key on a host
    (both named by ``scheduler.telemetry.streams``, which the caller passes: core imports no app)."""
    from core.messages import node_group, node_queue, workload_group

    keys = []
    for queue in (node_queue(node_name), node_queue(node_name, slow=True)):
        keys += [f"~{queue}", f"~{queue}{SEP}*", f"~_kombu.binding.{queue}", f"~_kombu.binding_permanent.{queue}"]
    keys += [f"~{key}" for key in unacked_keys(node_name).values()]
    scheduler = settings.SCHEDULER_QUEUE
    keys += [f"%W~{scheduler}", f"%W~{scheduler}{SEP}*"]
    keys += [f"~{key}" for key in streams] + [f"~{_any(node_name, workload_stream)}"]
    group = "&asgi__group__"  # channels-redis's pub/sub layer publishes a group's messages on this channel
    channels = [group + node_group(node_name), group + _any(node_name, workload_group)]
    return ["reset", "on", f"#{password_sha256}", *keys, *channels, "+@all", "-@dangerous"]
