"""The tenants' network on a GPU host, fenced off from everything but the internet.

With ``INSTANCE_NETWORK_MODE=fenced`` instances attach to one Docker bridge network
per host (``INSTANCE_NETWORK``, bridge interface ``INSTANCE_BRIDGE``, subnet
``INSTANCE_SUBNET``). A chain of the agent's own, ``GPUCLOUD-FENCE``, jumped to
from FORWARD for traffic leaving that bridge, drops every destination in the
private, shared, link-local (cloud metadata) and loopback ranges plus
``FENCE_EXTRA_CIDRS`` (the control plane's addresses, wherever they are) — the
tenants' own subnet included, so tenants cannot reach each other either — and
INPUT drops everything from the bridge to the host itself but replies to connections
the host opened (published ports, ``INSTANCE_PUBLISH_PORTS``). Replies to
connections the tenant did not open are not affected (conntrack).

The agent installs the rules at start and checks them before every launch: a
launch without them fails with that reason instead of running unfenced.
"""

import ipaddress
import subprocess

import docker
from django.conf import settings

from scheduler.errors import InvalidInput
from scheduler.node.launcher import LABEL, docker_client

CHAIN = "GPUCLOUD-FENCE"
BLOCKED = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",  # carrier-grade NAT, some clouds' internal ranges
    "169.254.0.0/16",  # link-local: cloud metadata services
    "127.0.0.0/8",
    "224.0.0.0/4",
]


def fence_rules() -> list[list[str]]:
    """The chain's rules, in order (iptables -A arguments after the chain name)."""
    cidrs = [*BLOCKED, *settings.FENCE_EXTRA_CIDRS]
    for cidr in cidrs:
        ipaddress.ip_network(cidr)  # a typo in FENCE_EXTRA_CIDRS fails here, loudly
    rules = [["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"]]
    rules += [["-d", cidr, "-j", "DROP"] for cidr in cidrs]
    return [*rules, ["-j", "RETURN"]]


def _jumps() -> list[tuple[str, list[str]]]:
    bridge = settings.INSTANCE_BRIDGE
    # Inserted at the top of their chain in this order, so INPUT ends up: replies to connections the
    # host opened (the published ports' proxy reaching a tenant's JupyterLab) pass, everything else drops.
    return [
        ("FORWARD", ["-i", bridge, "-j", CHAIN]),
        ("INPUT", ["-i", bridge, "-j", "DROP"]),
        ("INPUT", ["-i", bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]),
    ]


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=check, timeout=30)


def network_ensure() -> None:
    """Create the tenants' bridge network if it is missing."""
    client = docker_client()
    try:
        client.networks.get(settings.INSTANCE_NETWORK)
    except docker.errors.NotFound:
        client.networks.create(
            settings.INSTANCE_NETWORK,
            driver="bridge",
            ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=settings.INSTANCE_SUBNET)]),
            options={
                "com.docker.network.bridge.name": settings.INSTANCE_BRIDGE,
                "com.docker.network.bridge.enable_icc": "false",
            },
            labels={f"{LABEL}.deployment": settings.DEPLOYMENT_ID},
        )


def fence_install() -> None:
    """(Re)write the chain and make sure FORWARD and INPUT send the bridge's traffic to it."""
    network_ensure()
    if _iptables("-n", "-L", CHAIN, check=False).returncode != 0:
        _iptables("-N", CHAIN)
    _iptables("-F", CHAIN)
    for rule in fence_rules():
        _iptables("-A", CHAIN, *rule)
    for chain, rule in _jumps():
        if _iptables("-C", chain, *rule, check=False).returncode != 0:
            _iptables("-I", chain, "1", *rule)


def fence_problem() -> str | None:
    """Why the fence is not in place (None when it is): checked before every launch."""
    listed = _iptables("-S", CHAIN, check=False)
    if listed.returncode != 0:
        return f"the iptables chain {CHAIN} is missing"
    expected = [f"-A {CHAIN} " + " ".join(rule) for rule in fence_rules()]
    actual = [line for line in listed.stdout.splitlines() if line.startswith("-A ")]
    if [_normal(line) for line in actual] != [_normal(line) for line in expected]:
        return f"the iptables chain {CHAIN} does not hold the fence's rules"
    for chain, rule in _jumps():
        if _iptables("-C", chain, *rule, check=False).returncode != 0:
            return f"{chain} does not send traffic from {settings.INSTANCE_BRIDGE} to the fence"
    return None


def fence_check() -> None:
    problem = fence_problem()
    if problem:
        raise InvalidInput(f"the tenant network fence is not in place ({problem}): refusing to launch", field="network")


def _normal(line: str) -> str:
    # iptables -S prints "-m conntrack --ctstate RELATED,ESTABLISHED" and "/32"-less hosts its own way.
    return " ".join(sorted(line.replace("RELATED,ESTABLISHED", "ESTABLISHED,RELATED").split()))
