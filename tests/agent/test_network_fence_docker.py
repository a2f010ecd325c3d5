"""The fence on a GPU host whose Docker engine has its iptables on (IPv4 and IPv6), across a dockerd restart.

The test builds, with addresses of its own (10.241.0.0/16, fd41::/16):

    root namespace ("control plane")      GPU host namespace gfh<tag>             other host gfo<tag>
    PostgreSQL/Redis/web/registry  ──veth──  its own dockerd (iptables on,  ──veth──  a server standing for
    stand-ins on 10.241.10.1,                 ip6tables on), the tenants'               another host's containers,
    fd41:10::1                                network 10.241.12.0/24 +                  and the metadata addresses
                                              fd41:12::/64, the agent's fence           169.254.169.254, fd00:ec2::254

The fence functions run as the agent runs them: in a process inside the host's
namespace (``nsenter --net``), against that engine (``DOCKER_BASE_URL``). Before the
fence a tenant reaches everything (so the test can fail); with it, no control-plane
service, other host, metadata address, other tenant or the host itself, over IPv4 or
IPv6, while the tenant's published port still answers. Then dockerd is stopped
(SIGTERM) and started again with the same command line: Docker rewrites its rules
and the agent's periodic check (``fence_keep``) puts back whatever moved; the same
holds after it.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path

import docker
import pytest

from agent.images import find_busybox, rootfs_tar
from tests.agent.test_network_fence import Listeners, sh
from tests.conftest import wait_for

ROOT, HOST = ("10.241.10.1", "fd41:10::1"), ("10.241.10.2", "fd41:10::2")
BIP = "10.241.11.1/24"
TENANTS, TENANTS6 = "10.241.12.0/24", "fd41:12::/64"
LINK_HOST, LINK_OTHER = ("10.241.13.1", "fd41:13::1"), ("10.241.13.2", "fd41:13::2")
METADATA = ("169.254.169.254", "fd00:ec2::254")
SERVICES = ("postgresql", "redis", "web", "registry")
IMAGE = "gpucloud/fence-probe:latest"
REPO = Path(__file__).resolve().parents[2]


def url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}/" if ":" in address else f"http://{address}:{port}/"


class GpuHost:
    """A network namespace with its own dockerd (Docker's iptables and ip6tables on) and the tenants' network."""

    def __init__(self, tag: str, work: Path):
        self.tag, self.work = tag, work
        self.ns, self.other_ns = f"gfh{tag}", f"gfo{tag}"
        self.bridge, self.network = f"gft{tag}", f"gf-tenants-{tag}"
        self.socket = work / "docker.sock"
        self.dockerd: subprocess.Popen | None = None
        self.command = [
            "nsenter",
            f"--net=/var/run/netns/{self.ns}",
            "dockerd",
            "--data-root",
            str(work / "data"),
            "--exec-root",
            str(work / "exec"),
            "--pidfile",
            str(work / "docker.pid"),
            "-H",
            f"unix://{self.socket}",
            "--bip",
            BIP,
            "--experimental",
            "--ip6tables",
        ]
        self.client = docker.DockerClient(base_url=f"unix://{self.socket}", version="1.41", timeout=60)

    def inside(self, *command: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return sh("nsenter", f"--net=/var/run/netns/{ns or self.ns}", *command, check=check)

    def dockerd_start(self):
        log = open(self.work / "dockerd.log", "ab")
        self.dockerd = subprocess.Popen(self.command, stdout=log, stderr=log)
        log.close()

        def answers():
            if self.dockerd.poll() is not None:
                tail = (self.work / "dockerd.log").read_text()[-2000:]
                raise AssertionError(f"dockerd exited ({self.dockerd.returncode}): {tail}")
            try:
                return self.client.ping()
            except Exception:  # noqa: BLE001  (not listening yet)
                return False

        wait_for(answers, timeout=60, what="the GPU host's dockerd")

    def dockerd_stop(self):
        if self.dockerd is None or self.dockerd.poll() is not None:
            return
        self.dockerd.send_signal(signal.SIGTERM)
        try:
            self.dockerd.wait(45)
        except subprocess.TimeoutExpired:
            self.dockerd.kill()
            self.dockerd.wait(10)

    def agent(self, code: str) -> tuple:
        """Run ``code`` (its last line an expression) as the node agent would: in this host's namespace."""
        *body, last = code.strip().splitlines()
        done = subprocess.run(
            self._agent_command(*body, f"print(json.dumps({last}))"),
            capture_output=True,
            text=True,
            env=self._agent_env(),
            cwd=REPO,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

    def agent_loop(self) -> subprocess.Popen:
        """The agent's periodic fence check (``fence_forever``), every second, its log in agent.log."""
        log = open(self.work / "agent.log", "wb")
        loop = subprocess.Popen(
            self._agent_command("network.fence_forever(threading.Event())"),
            stdout=log,
            stderr=log,
            env={**self._agent_env(), "FENCE_CHECK_S": "1"},
            cwd=REPO,
        )
        log.close()
        return loop

    def agent_log(self) -> str:
        return (self.work / "agent.log").read_text()

    def _agent_command(self, *lines: str) -> list[str]:
        prelude = [
            "import json, logging, threading, django",
            "django.setup()",
            "logging.basicConfig(level=logging.INFO)",
        ]
        script = "\n".join([*prelude, "from agent import iptables, network", *lines])
        return ["nsenter", f"--net=/var/run/netns/{self.ns}", sys.executable, "-c", script]

    def _agent_env(self) -> dict:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DOCKER_BASE_URL": f"unix://{self.socket}",
            "INSTANCE_NETWORK_MODE": "fenced",
            "INSTANCE_NETWORK": self.network,
            "INSTANCE_BRIDGE": self.bridge,
            "INSTANCE_SUBNET": TENANTS,
        }


@pytest.fixture
def gpu_host():
    if os.geteuid() != 0:
        pytest.fail("the fence test needs root (iptables, network namespaces): make test runs as root in CI")
    tag = uuid.uuid4().hex[:5]
    work = Path(tempfile.mkdtemp(prefix="gf-"))
    host = GpuHost(tag, work)
    root_end, host_end, link_host, link_other = f"gf{tag}r", f"gf{tag}h", f"gf{tag}o", f"gf{tag}p"
    listeners, servers = Listeners(), []
    try:
        sh("ip", "netns", "add", host.ns)
        sh("ip", "netns", "add", host.other_ns)
        # Root (control plane) <-> GPU host.
        sh("ip", "link", "add", root_end, "type", "veth", "peer", "name", host_end)
        sh("ip", "link", "set", host_end, "netns", host.ns)
        sh("ip", "addr", "add", f"{ROOT[0]}/24", "dev", root_end)
        sh("ip", "addr", "add", f"{ROOT[1]}/64", "dev", root_end, "nodad")
        sh("ip", "link", "set", root_end, "up")
        host.inside("ip", "addr", "add", f"{HOST[0]}/24", "dev", host_end)
        host.inside("ip", "addr", "add", f"{HOST[1]}/64", "dev", host_end, "nodad")
        # GPU host <-> another host, which also holds the metadata addresses.
        host.inside("ip", "link", "add", link_host, "type", "veth", "peer", "name", link_other)
        host.inside("ip", "link", "set", link_other, "netns", host.other_ns)
        host.inside("ip", "addr", "add", f"{LINK_HOST[0]}/24", "dev", link_host)
        host.inside("ip", "addr", "add", f"{LINK_HOST[1]}/64", "dev", link_host, "nodad")
        for device in ("lo", host_end, link_host):
            host.inside("ip", "link", "set", device, "up")
        host.inside("ip", "route", "add", "default", "via", ROOT[0])
        host.inside("ip", "-6", "route", "add", "default", "via", ROOT[1])
        host.inside("ip", "route", "add", f"{METADATA[0]}/32", "via", LINK_OTHER[0])
        host.inside("ip", "-6", "route", "add", f"{METADATA[1]}/128", "via", LINK_OTHER[1])
        other = host.other_ns
        host.inside("ip", "addr", "add", f"{LINK_OTHER[0]}/24", "dev", link_other, ns=other)
        host.inside("ip", "addr", "add", f"{LINK_OTHER[1]}/64", "dev", link_other, "nodad", ns=other)
        host.inside("ip", "addr", "add", f"{METADATA[0]}/32", "dev", "lo", ns=other)
        host.inside("ip", "addr", "add", f"{METADATA[1]}/128", "dev", "lo", ns=other)
        for device in ("lo", link_other):
            host.inside("ip", "link", "set", device, "up", ns=other)
        host.inside("ip", "route", "add", "default", "via", LINK_HOST[0], ns=other)
        host.inside("ip", "-6", "route", "add", "default", "via", LINK_HOST[1], ns=other)
        host.inside("sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/forwarding")
        # Servers: the control plane's services on the root side, a host service, another host's.
        host.ports = {name: listeners.serve(ROOT[0]) for name in SERVICES}
        for port in host.ports.values():
            listeners.serve(ROOT[1], port)
        for ns, port in ((other, 18080), (host.ns, 18470)):
            servers.append(
                subprocess.Popen(
                    [
                        "nsenter",
                        f"--net=/var/run/netns/{ns}",
                        "python3",
                        "-m",
                        "http.server",
                        str(port),
                        "--bind",
                        "::",
                    ],
                    cwd=work,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        host.dockerd_start()
        host.client.api.import_image_from_data(
            rootfs_tar(find_busybox()), repository=IMAGE.split(":")[0], tag="latest", changes=["ENV PATH=/bin"]
        )
        # The tenants' network, IPv6 on (network_ensure finds it; it makes IPv4-only ones itself), and traffic
        # between containers on: Docker's own "-i br -o br -j ACCEPT" lets tenants meet unless the fence stops them.
        host.client.networks.create(
            host.network,
            driver="bridge",
            enable_ipv6=True,
            ipam=docker.types.IPAMConfig(
                pool_configs=[docker.types.IPAMPool(subnet=TENANTS), docker.types.IPAMPool(subnet=TENANTS6)]
            ),
            options={"com.docker.network.bridge.name": host.bridge, "com.docker.network.bridge.enable_icc": "true"},
        )
        serve = "mkdir -p /www && echo ok > /www/index.html && httpd -f -p 8080 -h /www"
        for name, ports in (("other", None), ("published", {"8080/tcp": None})):
            host.client.containers.run(
                IMAGE, ["sh", "-c", serve], name=f"gf{tag}-{name}", detach=True, network=host.network, ports=ports
            )
        yield host
    finally:
        try:
            for container in host.client.containers.list(all=True):
                container.remove(force=True)
        except Exception:  # noqa: BLE001  (dockerd never came up)
            pass
        host.dockerd_stop()
        for server in servers:
            server.kill()
            server.wait(10)
        listeners.close()
        for line in reversed(Path("/proc/mounts").read_text().splitlines()):
            if str(work) in line.split()[1]:
                sh("umount", "-l", line.split()[1], check=False)
        sh("ip", "link", "del", root_end, check=False)
        sh("ip", "netns", "del", host.other_ns, check=False)
        sh("ip", "netns", "del", host.ns, check=False)
        shutil.rmtree(work, ignore_errors=True)


def targets(host: GpuHost) -> dict[str, tuple[str, int]]:
    """What a tenant must not reach, by name: each address this test created, and a port it serves."""
    other = host.client.containers.get(f"gf{host.tag}-other").attrs["NetworkSettings"]["Networks"][host.network]
    found = {}
    for family, index in (("v4", 0), ("v6", 1)):
        for name, port in host.ports.items():
            found[f"{name} {family}"] = (ROOT[index], port)
        found[f"other host {family}"] = (LINK_OTHER[index], 18080)
        found[f"metadata {family}"] = (METADATA[index], 18080)
        found[f"the host itself {family}"] = (HOST[index], 18470)
    found["other tenant v4"] = (other["IPAddress"], 8080)
    found["other tenant v6"] = (other["GlobalIPv6Address"], 8080)
    return found


def reached(host: GpuHost) -> dict[str, bool]:
    """Which targets a fresh tenant container on the tenants' network gets an HTTP answer from (all at once)."""
    found = targets(host)
    request = "printf 'GET / HTTP/1.0\\r\\n\\r\\n'"
    tries = " ".join(
        f"( {request} | nc -w 3 {address} {port} | grep -q '^HTTP/1' && echo 'yes {name}' || echo 'no {name}' ) &"
        for name, (address, port) in found.items()
    )
    output = host.client.containers.run(
        IMAGE, ["sh", "-c", f"{tries} wait"], network=host.network, remove=True
    ).decode()
    answers = {line.split(" ", 1)[1]: line.startswith("yes") for line in output.splitlines() if " " in line}
    assert set(answers) == set(found), output
    return answers


def settled(host: GpuHost, expected: dict[str, bool]) -> None:
    last = {}
    try:
        wait_for(lambda: last.update(reached(host)) or last == expected, timeout=30, what="the expected reachability")
    except AssertionError:
        assert last == expected


def published_answers(host: GpuHost) -> bool:
    """The tenant's published port, reached at the host's address from the control-plane side and from the host."""
    container = host.client.containers.get(f"gf{host.tag}-published")
    port = int(container.ports["8080/tcp"][0]["HostPort"])
    address = url(HOST[0], port)
    try:
        from_root = urllib.request.urlopen(address, timeout=5).read() == b"ok\n"
    except OSError:
        return False
    check = f"import urllib.request; print(urllib.request.urlopen('{address}', timeout=5).read() == b'ok\\n')"
    from_host = host.inside("python3", "-c", check, check=False).stdout.strip() == "True"
    return from_root and from_host


def test_a_tenant_reaches_nothing_private_with_dockers_iptables_on_and_after_dockerd_restarts(gpu_host):
    host = gpu_host
    nothing = dict.fromkeys(targets(host), False)
    everything = dict.fromkeys(targets(host), True)
    # Unfenced, with Docker's own rules only: every target answers (so each check below can fail).
    settled(host, everything)  # IPv6 addresses come up a little later (duplicate address detection)
    assert wait_for(lambda: published_answers(host), timeout=20, what="the published port")

    fenced, log = host.agent("network.fence_install()")
    assert fenced == ["IPv4", "IPv6"], log
    assert host.agent("network.fence_problem()")[0] is None
    assert reached(host) == nothing
    assert published_answers(host)

    loop = host.agent_loop()
    try:
        # dockerd restarted: SIGTERM, then the same command line. Its containers stop with it.
        host.dockerd_stop()
        host.dockerd_start()
        for name in ("other", "published"):
            host.client.containers.get(f"gf{host.tag}-{name}").start()
        forward = host.inside("iptables", "-S", "FORWARD").stdout.splitlines()
        assert forward[1] == "-A FORWARD -j DOCKER-USER", forward  # Docker put its jump back first
        assert wait_for(lambda: host.agent("network.fence_problem()")[0] is None, timeout=30, what="the fence")
        assert wait_for(lambda: published_answers(host), timeout=20, what="the published port after the restart")
        assert reached(host) == nothing

        # A rule that accepts the bridge's IPv6 traffic ahead of the fence (what Docker versions that keep no
        # DOCKER-USER for IPv6 do to a jump at the top of FORWARD): the periodic check puts the fence back first.
        bridge = host.bridge
        host.inside("ip6tables", "-I", "FORWARD", "1", "-i", bridge, "!", "-o", bridge, "-j", "ACCEPT")
        noticed = (
            f"IPv6: FORWARD accepts traffic from {bridge} before the fence (`-i {bridge} ! -o {bridge} -j ACCEPT`)"
        )
        assert wait_for(lambda: noticed in host.agent_log(), timeout=30, what="the periodic check's log line")
        assert "out of place" in host.agent_log()
        assert wait_for(lambda: host.agent("network.fence_problem()")[0] is None, timeout=30, what="the fence")
        assert reached(host) == nothing
        assert loop.poll() is None, host.agent_log()  # the loop survived the restart
    finally:
        loop.kill()
        loop.wait(10)
