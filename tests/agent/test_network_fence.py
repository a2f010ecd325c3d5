"""The tenants' network fence on the root engine (Docker's iptables off), with test hosts the test makes itself.

A "control plane" server lives in a network namespace behind a veth pair. Before the
fence an instance reaches it, the host and another tenant (so the test can fail);
with the fence it reaches none of them, while the host (the agent) still reaches
the control plane. A rule that accepts the bridge's traffic ahead of the fence is
noticed and the fence put back in front of it. Every address used here is one the
test created. With Docker's iptables on, and across a dockerd restart:
test_network_fence_docker.py.
"""

import io
import os
import socket
import subprocess
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from agent import iptables, launcher, network
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db

SUBNET, GATEWAY = "10.213.77.0/24", "10.213.77.1"
CP_HOST, CP_SERVER = "10.214.77.1", "10.214.77.2"  # the veth pair to the "control plane" namespace


def sh(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=check, timeout=60)


@pytest.fixture
def fenced(settings, base_image):
    if os.geteuid() != 0:
        pytest.fail("the fence test needs root (iptables, network namespaces): make test runs as root in CI")
    tag = uuid.uuid4().hex[:5]
    settings.INSTANCE_NETWORK_MODE = "fenced"
    settings.INSTANCE_NETWORK, settings.INSTANCE_BRIDGE = f"gpuc-test-{tag}", f"gpuct{tag}"
    settings.INSTANCE_SUBNET = SUBNET
    namespace, host_end, ns_end = f"gpuc-cp-{tag}", f"gcp{tag}h", f"gcp{tag}n"
    forwarding = open("/proc/sys/net/ipv4/ip_forward").read().strip()
    made_user_chain = {family: network.USER_CHAIN not in iptables.table_read(family).chains for family in families()}
    server = None
    _remove_leftovers()  # a run killed midway keeps its namespace and veth, whose address would shadow ours
    try:
        sh("ip", "netns", "add", namespace)
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        sh("ip", "link", "set", ns_end, "netns", namespace)
        sh("ip", "addr", "add", f"{CP_HOST}/30", "dev", host_end)
        sh("ip", "link", "set", host_end, "up")
        sh("ip", "netns", "exec", namespace, "ip", "addr", "add", f"{CP_SERVER}/30", "dev", ns_end)
        sh("ip", "netns", "exec", namespace, "ip", "link", "set", ns_end, "up")
        sh("ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        sh("ip", "netns", "exec", namespace, "ip", "route", "add", "default", "via", CP_HOST)
        server = subprocess.Popen(
            ["ip", "netns", "exec", namespace, "python3", "-m", "http.server", "18080", "--bind", CP_SERVER],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write("1")  # so that without the fence the control plane *is* reachable from an instance
        network.network_ensure()
        wait_for(lambda: reachable_from_host(), timeout=20, what="the control-plane server")
        yield settings
    finally:
        remove_fence(made_user_chain)  # first: the root namespace is shared
        try:
            client = launcher.docker_client()
            for container in client.containers.list(all=True, filters={"label": "gpuc-fence-test"}):
                container.remove(force=True)
            client.networks.get(settings.INSTANCE_NETWORK).remove()
        except Exception:  # noqa: BLE001  (never created, or the engine is away: the rest is still cleaned)
            pass
        if server is not None:
            server.kill()
            server.wait(10)
        sh("ip", "link", "del", host_end, check=False)
        sh("ip", "netns", "del", namespace, check=False)
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write(forwarding)


def _remove_leftovers() -> None:
    """Namespaces and veth ends an earlier run of this fixture left behind (only this test's own names)."""
    for line in sh("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith("gpuc-cp-"):
            sh("ip", "netns", "del", name, check=False)
    for line in sh("ip", "-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith("gcp") and name.endswith("h"):
            sh("ip", "link", "del", name, check=False)


def families():
    return [f for f in (iptables.IPV4, iptables.IPV6) if network._readable(f)]


def remove_fence(made_user_chain: dict):
    """Take every rule of the fence out of the root namespace (and DOCKER-USER, where the fence made it)."""
    for family in families():
        table = iptables.table_read(family)
        ours = [*network._jumps()[1:], *(("INPUT", rule) for rule in network._input_rules(family))]
        ours += network._inbound()
        lines = []
        for chain, rule in [*ours, *network._retired()]:
            lines += [f"-D {chain} " + " ".join(rule)] * table.count(chain, rule)
        if made_user_chain.get(family) and network.USER_CHAIN in table.chains:
            lines += ["-D FORWARD -j DOCKER-USER"] * table.count("FORWARD", ["-j", network.USER_CHAIN])
            lines += [f"-F {network.USER_CHAIN}", f"-X {network.USER_CHAIN}"]
        if network.CHAIN in table.chains:
            lines += [f"-F {network.CHAIN}", f"-X {network.CHAIN}"]
        iptables.table_apply(family, lines)
        if family is iptables.IPV4:  # the gangs' jump ahead of Docker's masquerade
            jump = network._nat_jump()
            count = iptables.table_read(family, "nat").count("POSTROUTING", jump)
            iptables.table_apply(family, ["-D POSTROUTING " + " ".join(jump)] * count, table="nat")


def reachable_from_host() -> bool:
    try:
        return urllib.request.urlopen(f"http://{CP_SERVER}:18080/", timeout=3).status == 200
    except OSError:
        return False


def tenant(settings, image, command, name):
    return launcher.docker_client().containers.run(
        image, command, detach=True, network=settings.INSTANCE_NETWORK, labels={"gpuc-fence-test": name}
    )


def reaches(settings, image, address: str) -> bool:
    """Whether a fresh instance on the tenants' network gets an HTTP answer from ``host:port``."""
    host, port = address.rsplit(":", 1)
    request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} {port} | grep -q '^HTTP/1'"
    probe = tenant(settings, image, ["sh", "-c", request], "probe")
    return probe.wait(timeout=30)["StatusCode"] == 0


@pytest.fixture
def host_listener():
    """A TCP server on the host's bridge address, as the agent's own services would be."""
    listeners = Listeners()
    try:
        yield f"{GATEWAY}:{listeners.serve(GATEWAY)}"
    finally:
        listeners.close()


class Listeners:
    """TCP servers answering HTTP 200 on addresses of the root namespace (the control-plane side)."""

    def __init__(self):
        self.sockets = []

    def serve(self, address: str, port: int = 0) -> int:
        listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen()
        self.sockets.append(listener)
        threading.Thread(target=self._answer, args=(listener,), daemon=True).start()
        return listener.getsockname()[1]

    @staticmethod
    def _answer(listener):
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    def close(self):
        for listener in self.sockets:
            listener.close()


def test_instances_reach_no_control_plane_host_or_other_tenant_once_fenced(fenced, base_image, host_listener):
    settings = fenced
    other = tenant(
        settings,
        base_image,
        ["sh", "-c", "mkdir -p /www && echo ok > /www/index.html && httpd -f -p 8080 -h /www"],
        "other",
    )
    other.reload()
    other_url = f"{other.attrs['NetworkSettings']['Networks'][settings.INSTANCE_NETWORK]['IPAddress']}:8080"
    control_plane = f"{CP_SERVER}:18080"
    # Unfenced, everything is in reach: the checks below can fail.
    assert reaches(settings, base_image, control_plane)
    assert reaches(settings, base_image, host_listener)
    wait_for(lambda: reaches(settings, base_image, other_url), timeout=20, what="the other tenant's server")

    network.fence_install()
    assert network.fence_problem() is None

    assert not reaches(settings, base_image, control_plane)
    assert not reaches(settings, base_image, host_listener)
    assert not reaches(settings, base_image, other_url)
    assert reachable_from_host()  # the agent itself still reaches the control plane


def test_a_launch_is_refused_when_the_fence_is_missing(fenced):
    network.fence_install()
    assert network.fence_problem() is None
    iptables.table_apply(iptables.IPV4, [f"-D DOCKER-USER -i {fenced.INSTANCE_BRIDGE} -j {network.CHAIN}"])
    assert "does not send traffic" in network.fence_problem()
    with pytest.raises(network.InvalidInput, match="fence is not in place"):
        network.fence_check()
    with pytest.raises(CommandError, match="IPv4: DOCKER-USER does not send traffic"):
        call_command("fence")  # what an operator runs on the host
    out = io.StringIO()
    call_command("fence", "--install", stdout=out)
    assert out.getvalue().endswith(f"fence in place for {fenced.INSTANCE_BRIDGE}\n")


def test_an_accept_ahead_of_the_fence_is_noticed_and_the_fence_put_back_first(fenced, base_image, caplog):
    """What Docker does to a rule at the top of FORWARD when it starts: its ACCEPT for the bridge lands above."""
    settings = fenced
    network.fence_install()
    control_plane = f"{CP_SERVER}:18080"
    assert not reaches(settings, base_image, control_plane)
    bridge = settings.INSTANCE_BRIDGE
    docker_like = f"-i {bridge} ! -o {bridge} -j ACCEPT"
    iptables.table_apply(iptables.IPV4, [f"-I FORWARD 1 {docker_like}"])
    try:
        assert (
            network.fence_problem() == f"IPv4: FORWARD accepts traffic from {bridge} before the fence (`{docker_like}`)"
        )
        assert reaches(settings, base_image, control_plane)  # the hole is real: order matters, not only presence

        with caplog.at_level("WARNING", logger="agent.network"):
            assert "accepts traffic" in network.fence_keep()  # the agent's periodic check
        assert "out of place" in caplog.text
        assert network.fence_problem() is None
        assert not reaches(settings, base_image, control_plane)
        assert network.fence_keep() is None  # in place: nothing to do
    finally:
        iptables.table_apply(iptables.IPV4, [f"-D FORWARD {docker_like}"])


def test_ipv6_is_fenced_too_and_required_while_ipv6_is_on_for_the_bridge(fenced, monkeypatch):
    network.fence_install()
    sysctl = Path(f"/proc/sys/net/ipv6/conf/{fenced.INSTANCE_BRIDGE}/disable_ipv6")
    if not sysctl.exists():
        pytest.fail("this test needs a kernel with IPv6 (make test runs where it has it)")
    sysctl.write_text("0")
    assert network.fence_problem() is None
    iptables.table_apply(iptables.IPV6, [f"-D INPUT -i {fenced.INSTANCE_BRIDGE} -j DROP"])
    assert network.fence_problem() == f"IPv6: INPUT does not hold the fence's rules for {fenced.INSTANCE_BRIDGE}"
    sysctl.write_text("1")  # no IPv6 on the bridge: the host takes none from tenants, the IPv4 fence is enough
    assert network.fence_problem() is None
    monkeypatch.setattr(network, "available", lambda family: family is not iptables.IPV6)
    assert network.fence_problem() is None  # nor ip6tables
    sysctl.write_text("0")
    assert network.fence_problem() == "IPv6: ip6tables is missing on this host"
    monkeypatch.undo()
    network.fence_install()
    assert network.fence_problem() is None


def test_a_published_service_is_reached_from_the_host_through_the_fence(fenced, base_image, user):
    """JupyterLab & co.: the instance's port is published on the node; the host gets the answer, fenced or not."""
    from scheduler.models import Node
    from tests.scheduler.factories import workload

    settings = fenced
    settings.INSTANCE_PUBLISH_PORTS, settings.INSTANCE_PORT_BIND_IP = True, "127.0.0.1"
    settings.INSTANCE_SERVICE_PORTS = {"JupyterLab": 8888}
    network.fence_install()
    node = Node.objects.create(name=f"ports-{uuid.uuid4().hex[:6]}", hostname="node-a", cpu_cores=2, memory_mb=2048)
    serve = "mkdir -p /www && echo jupyter > /www/index.html && httpd -f -p 8888 -h /www"
    work = workload(user, image_ref=base_image, command=["sh", "-c", serve], memory_mb=256)
    spec = launcher.container_spec(work, node=node, shares=[])
    assert spec["ports"] == {"8888/tcp": ("127.0.0.1", None)}
    spec["labels"]["gpuc-fence-test"] = "ports"
    try:
        launcher.container_launch(work, spec)
        host_port = launcher.container_ports(work.container_name)["8888"]

        def answer():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{host_port}/", timeout=3).read()
            except OSError:
                return None

        assert wait_for(answer, timeout=20, what="the published service") == b"jupyter\n"
        assert network.fence_problem() is None  # with the fence in place
    finally:
        launcher.container_remove(work)
