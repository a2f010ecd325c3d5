"""Operators' node lifecycle: list the nodes, drain one, take it back into service, remove it.

    python manage.py node list
    python manage.py node drain gpu-07 [--notice 3600]     # nothing new; work stops at the deadline
    python manage.py node activate gpu-07
    python manage.py node remove gpu-07 [--force]          # drained or lost; its agent stops
    python manage.py node evacuate gpu-07 [--to gpu-09]    # move its stopped instances' disks elsewhere

A host is added by starting its node agent: it registers.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from core.errors import ServiceError
from scheduler.models import Node, Workload, WorkloadKind, WorkloadStatus
from scheduler.services.moves import workload_move
from scheduler.services.nodes import node_activate, node_drain, node_remove

S = WorkloadStatus


class Command(BaseCommand):
    help = "List, drain, activate or remove GPU nodes."

    def add_arguments(self, parser):
        verbs = parser.add_subparsers(dest="verb", required=True)
        verbs.add_parser("list")
        drain = verbs.add_parser("drain")
        drain.add_argument("name")
        drain.add_argument("--notice", type=int, default=settings.DRAIN_NOTICE_S, help="seconds before work stops")
        verbs.add_parser("activate").add_argument("name")
        remove = verbs.add_parser("remove")
        remove.add_argument("name")
        remove.add_argument("--force", action="store_true", help="even if instances keep their disk there")
        evacuate = verbs.add_parser("evacuate")
        evacuate.add_argument("name")
        evacuate.add_argument("--to", help="the host to move them to (default: chosen for each)")

    def handle(self, *args, verb, **options):
        if verb == "list":
            return self._list()
        node = Node.objects.filter(name=options["name"]).first()
        if node is None:
            raise CommandError(f"no node named {options['name']!r}")
        try:
            if verb == "drain":
                node = node_drain(node=node, notice_s=options["notice"])
                self.stdout.write(f"{node.name} draining; work still running at {node.drain_deadline:%H:%M} UTC stops")
            elif verb == "evacuate":
                self._evacuate(node, options["to"])
            elif verb == "activate":
                node_activate(node=node)
                self.stdout.write(f"{node.name} active")
            else:
                node_remove(node=node, force=options["force"])
                self.stdout.write(f"{node.name} removed; its agent stops at its next heartbeat")
        except ServiceError as exc:
            raise CommandError(exc.message) from exc

    def _evacuate(self, node, to: str | None) -> None:
        target = Node.objects.filter(name=to).first() if to else None
        if to and target is None:
            raise CommandError(f"no node named {to!r}")
        homed = Workload.objects.filter(kind=WorkloadKind.INSTANCE, status__in=[S.STOPPED, S.FAILED]).filter(
            Q(node=node) | Q(node__isnull=True, pinned_node=node)
        )
        for workload in homed:
            try:
                move = workload_move(workload, target=target)
                self.stdout.write(f"instance workload {workload.pk}: moving to {move.target.name}")
            except ServiceError as exc:
                self.stderr.write(f"instance workload {workload.pk}: {exc.message}")

    def _list(self):
        holding = WorkloadStatus.holding_resources()
        for node in Node.objects.order_by("name"):
            running = Workload.objects.filter(node=node, status__in=holding).count()
            self.stdout.write(
                f"{node.name:20} {node.status:9} {node.address or '-':16} {node.gpus.count()} cards  "
                f"{running} running  heartbeat {node.last_heartbeat:%Y-%m-%d %H:%M:%S}"
                if node.last_heartbeat
                else f"{node.name:20} {node.status:9} never heard"
            )
