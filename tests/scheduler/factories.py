"""Small builders for scheduler rows."""

from portal.services.demo import STANDIN_IMAGE
from scheduler.models import Workload, WorkloadSpec, WorkloadStatus


def workload(owner, *, gpu_model="RTX3090", gpu_count=1, gpu_milli=1000, cpu=1, memory_mb=1024, **fields):
    """A workload row, and its spec (``command``, ``env``) where given."""
    spec = {name: fields.pop(name) for name in ("command", "env") if name in fields}
    made = Workload.objects.create(
        owner=owner,
        kind=fields.pop("kind", "instance"),
        name=fields.pop("name", "w"),
        image_ref=fields.pop("image_ref", STANDIN_IMAGE),
        gpu_model=gpu_model,
        gpu_count=gpu_count,
        gpu_milli=gpu_milli,
        cpu_cores=cpu,
        memory_mb=memory_mb,
        disk_gb=fields.pop("disk_gb", 10),
        status=fields.pop("status", WorkloadStatus.QUEUED),
        **fields,
    )
    if spec:
        WorkloadSpec.objects.create(workload=made, **spec)
    return made
