"""The live tick on SQLite (``make run``'s database): it places work while other work runs and accrues service.

The suite runs on PostgreSQL, where ``rows_update`` writes with one ``UPDATE ... FROM unnest``; SQLite takes
the other path. The tick's accrual passes its own records, not model instances, and that path once handed
them to ``bulk_update``, which refused them: on ``make run`` every tick failed from the first minute of a
running instance on, and nothing queued was placed again. This runs the tick in a subprocess on a SQLite file.
"""

from tests.sqlite import on_sqlite

SCRIPT = """
import json, uuid
from datetime import timedelta

import django
django.setup()
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from core.clients import redis_client
from core.messages import node_queue
from scheduler.models import Workload, WorkloadStatus as S
from agent.gpus import simulated_inventory
from scheduler.services.nodes import node_register
from scheduler.tick import schedule_tick
from tests.scheduler.factories import workload

call_command("migrate", verbosity=0)
name = f"sqlite-{uuid.uuid4().hex[:8]}"
node_register(name=name, hostname="testhost", cpu_cores=8, memory_mb=16384, disk_gb=1000,  # disk counted too
              gpus=simulated_inventory("sim:2xRTX3090", name), simulated=True, nvidia_runtime=False)
owner = get_user_model().objects.create_user("sq")
first = workload(owner)
placed_first = schedule_tick().placed
# Its agent reports it running, ten minutes ago: its service is due to be written at the next tick.
Workload.objects.filter(pk=first.pk).update(status=S.RUNNING, started_at=timezone.now() - timedelta(minutes=10))
second = workload(owner)
placed_second = schedule_tick().placed
redis_client().delete(node_queue(name))
print(json.dumps({
    "placed": [placed_first, placed_second], "ids": [first.pk, second.pk],
    "status": Workload.objects.get(pk=second.pk).status,
    "attained": Workload.objects.get(pk=first.pk).attained_service,
}))
"""


def test_the_tick_on_sqlite_places_work_beside_running_work_and_writes_its_service(tmp_path):
    out = on_sqlite(SCRIPT, tmp_path)
    first, second = out["ids"]
    assert out["placed"] == [[first], [second]] and out["status"] == "starting", out
    # Ten minutes of one whole card, give or take the seconds the script took.
    assert 590 <= out["attained"] <= 700, out
