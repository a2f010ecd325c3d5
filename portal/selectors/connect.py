"""How to reach the services inside a running instance (JupyterLab, TensorBoard, SSH) on its node."""

from django.conf import settings

from scheduler.models import WorkloadStatus


def services_of(workload) -> list[dict]:
    """One entry per published service of a running instance: name, ports, host and a URL or command."""
    if workload.status != WorkloadStatus.RUNNING or not workload.ports or workload.node is None:
        return []
    host = settings.INSTANCE_PUBLIC_HOST or workload.node.hostname
    found = []
    for name, port in settings.INSTANCE_SERVICE_PORTS.items():
        host_port = workload.ports.get(str(port))
        if host_port is None:
            continue
        address = f"ssh -p {host_port} root@{host}" if port == 22 else f"http://{host}:{host_port}/"
        found.append({"name": name, "port": port, "host": host, "host_port": host_port, "address": address})
    return found
