"""How the instance page and the API tell the way to a running instance's published services."""

import pytest

from portal.selectors.connect import services_of
from scheduler.models import Node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


def test_published_ports_become_addresses_on_the_public_host(user, settings):
    settings.INSTANCE_SERVICE_PORTS = {"JupyterLab": 8888, "SSH": 22, "TensorBoard": 6006}
    node = Node.objects.create(name="gpu-a", hostname="gpu-a.lab", cpu_cores=8, memory_mb=8192)
    running = workload(user, status="running", node=node, ports={"8888": 40001, "22": 40002})
    assert services_of(running) == [
        {
            "name": "JupyterLab",
            "port": 8888,
            "host": "gpu-a.lab",
            "host_port": 40001,
            "address": "http://gpu-a.lab:40001/",
        },
        {"name": "SSH", "port": 22, "host": "gpu-a.lab", "host_port": 40002, "address": "ssh -p 40002 root@gpu-a.lab"},
    ]  # TensorBoard was not published: left out
    settings.INSTANCE_PUBLIC_HOST = "gpu.example.org"
    assert services_of(running)[0]["address"] == "http://gpu.example.org:40001/"
    running.status = "stopped"
    assert services_of(running) == []  # nothing to reach while it does not run
