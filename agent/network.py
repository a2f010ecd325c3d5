"""The tenants' network on a GPU host, fenced off from everything but the internet.

With ``INSTANCE_NETWORK_MODE=fenced`` instances attach to one Docker bridge network
per host (``INSTANCE_NETWORK``, bridge interface ``INSTANCE_BRIDGE``, subnet
``INSTANCE_SUBNET``). A chain of the agent's own, ``GPUCLOUD-FENCE``, drops traffic
from that bridge to every destination in the private, shared, link-local (cloud
metadata), loopback and multicast ranges plus ``FENCE_EXTRA_CIDRS`` (the control
plane's addresses, wherever they are) — the tenants' own subnet included, so
tenants cannot reach each other either. Replies to connections the tenant did not
open are not affected (conntrack).

Where the fence sits: Docker (with its iptables on) puts ``-j DOCKER-USER`` first
in FORWARD and its own ACCEPT rules after, and moves that jump back to the top
whenever it starts; ``DOCKER-USER`` is the documented place for rules that must
come first, and Docker never empties it. The fence is jumped to from the top of
``DOCKER-USER``; where Docker has not made that chain (its iptables off, or
ip6tables on Docker versions that leave IPv6 alone) the agent makes it and puts
``-j DOCKER-USER`` first in FORWARD itself. INPUT gets, at its top, a rule that
drops everything from the bridge to the host itself but replies to connections
the host opened (published ports, ``INSTANCE_PUBLISH_PORTS``) and, for IPv6,
neighbour discovery (without which IPv6 on the bridge cannot work at all).

A gang's members reach each other (``gangs.py``): the fence jumps to ``GPUCLOUD-GANGS`` before its
drops for what leaves the bridge, ``DOCKER-USER`` jumps to the same chain right after the fence's jump
for what goes to the bridge and then drops what goes to the bridge new and untranslated (neither a
member pair, a reply nor a published port: the tenants' subnets are routed between the hosts), and the
nat table's ``POSTROUTING`` jumps first to its own ``GPUCLOUD-GANGS`` for what leaves the tenants'
subnet (IPv4), so member pairs are not masqueraded.

The same is done with ip6tables (``BLOCKED`` per family). The check looks at
order as well as presence: no rule before the jumps (in FORWARD, in DOCKER-USER)
or before the INPUT drop may accept new traffic from the bridge, directly or
through a chain it jumps to. The IPv6 part is required when IPv6 is on for the
bridge (``/proc/sys/net/ipv6/conf/<bridge>/disable_ipv6`` is 0, the kernel's
default); with IPv6 off there, no IPv6 packet from a tenant reaches the host's
stack and the IPv4 fence is all there is to check.

The agent installs the fence at start, checks it before every launch (a launch
without it fails with that reason instead of running unfenced), and every
``FENCE_CHECK_S`` puts it back, with a log line, when something moved it.
Everything runs in the agent's own network namespace (the host's).
"""

import ipaddress
import logging
import threading
from pathlib import Path

import docker
from django.conf import settings

from agent.gangs import CHAIN as GANGS_CHAIN
from agent.gangs import chain_lines as gang_chain_lines
from agent.iptables import IPV4, IPV6, Family, IptablesError, Table, available, table_apply, table_read
from agent.launcher import LABEL, docker_client
from core.errors import InvalidInput

log = logging.getLogger(__name__)

CHAIN = "GPUCLOUD-FENCE"
USER_CHAIN = "DOCKER-USER"
BLOCKED = {
    4: [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",  # carrier-grade NAT, some clouds' internal ranges
        "169.254.0.0/16",  # link-local: cloud metadata services
        "127.0.0.0/8",
        "224.0.0.0/4",
    ],
    6: [
        "::/127",  # unspecified and loopback
        "::ffff:0:0/96",  # IPv4-mapped: IPv4's private ranges by another name
        "64:ff9b::/96",  # NAT64 (well-known and local-use prefixes): the same, through a translator
        "64:ff9b:1::/48",
        "fc00::/7",  # unique local, where clouds put their IPv6 metadata (fd00:ec2::254)
        "fe80::/10",  # link-local
        "fec0::/10",  # the old site-local
        "ff00::/8",  # multicast
    ],
}


def fence_rules(family: Family = IPV4) -> list[list[str]]:
    """The chain's rules, in order (iptables -A arguments after the chain name)."""
    extra = [ipaddress.ip_network(cidr, strict=False) for cidr in settings.FENCE_EXTRA_CIDRS]  # a typo fails here
    cidrs = [*BLOCKED[family.version], *(str(net) for net in extra if net.version == family.version)]
    rules = [["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"]]
    rules += [["-j", GANGS_CHAIN]]  # a gang's members to their fellows, and nothing else (gangs.py)
    rules += [["-d", cidr, "-j", "DROP"] for cidr in cidrs]
    return [*rules, ["-j", "RETURN"]]


def _jumps() -> list[tuple[str, list[str]]]:
    """FORWARD -> DOCKER-USER -> the fence, each first in its chain."""
    return [("FORWARD", ["-j", USER_CHAIN]), (USER_CHAIN, ["-i", settings.INSTANCE_BRIDGE, "-j", CHAIN])]


def _inbound() -> list[tuple[str, list[str]]]:
    """What goes to the bridge from elsewhere, after the fence's jump (what comes from the bridge meets the
    fence first): a gang's member pairs (their chain), replies, and what Docker's published ports translated
    (DNAT); nothing else. The tenants' subnets are routed between the hosts for the gangs, and Docker
    accepts a routed packet to a container wherever FORWARD's policy is ACCEPT (``ip_forward`` on before
    dockerd started), so another host, or anything that routes there, would reach every tenant's ports."""
    bridge = settings.INSTANCE_BRIDGE
    new = ["-m", "conntrack", "!", "--ctstate", "ESTABLISHED,RELATED,DNAT"]
    return [(USER_CHAIN, ["-o", bridge, "-j", GANGS_CHAIN]), (USER_CHAIN, ["-o", bridge, *new, "-j", "DROP"])]


def _nat_jump() -> list[str]:
    """First in the nat table's POSTROUTING, ahead of Docker's masquerade of the tenants' subnet."""
    return ["-s", settings.INSTANCE_SUBNET, "-j", GANGS_CHAIN]


def _input_rules(family: Family) -> list[list[str]]:
    """The top of INPUT, in order: replies to connections the host opened pass, everything else drops."""
    bridge = settings.INSTANCE_BRIDGE
    rules = [["-i", bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]]
    if family is IPV6:  # neighbour solicitation / advertisement with the gateway: IPv6's ARP
        rules += [
            ["-i", bridge, "-p", "ipv6-icmp", "-m", "icmp6", "--icmpv6-type", t, "-j", "ACCEPT"] for t in ("135", "136")
        ]
    return [*rules, ["-i", bridge, "-j", "DROP"]]


def _retired() -> list[tuple[str, list[str]]]:
    """Rules earlier versions installed: removed when the fence is installed."""
    return [("FORWARD", ["-i", settings.INSTANCE_BRIDGE, "-j", CHAIN])]


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


def ipv6_on_bridge() -> bool:
    """Whether the host's stack takes IPv6 on the tenants' bridge (a bridge not made yet inherits 'default')."""
    conf = Path("/proc/sys/net/ipv6/conf")
    for name in (settings.INSTANCE_BRIDGE, "default"):
        try:
            return (conf / name / "disable_ipv6").read_text().strip() == "0"
        except OSError:
            continue
    return False  # no IPv6 in this kernel


def fence_install() -> list[str]:
    """(Re)write the fence for IPv4, and IPv6 where ip6tables works; returns the families fenced."""
    network_ensure()
    fenced = []
    for family in (IPV4, IPV6):
        if family is IPV6 and not _readable(family):
            if ipv6_on_bridge():
                log.error(
                    "IPv6 is on for %s but ip6tables cannot be used here: launches are refused",
                    settings.INSTANCE_BRIDGE,
                )
            else:
                log.info("IPv6 is off on %s: only the IPv4 fence is needed", settings.INSTANCE_BRIDGE)
            continue
        try:
            table_apply(family, _install_lines(family, table_read(family)))
        except IptablesError:  # the table changed under us (dockerd starting): once more
            table_apply(family, _install_lines(family, table_read(family)))
        if family is IPV4:
            table_apply(family, _nat_lines(table_read(family, "nat")), table="nat")
        fenced.append(family.name)
    log.info("tenant network fence installed for %s (%s)", settings.INSTANCE_BRIDGE, ", ".join(fenced))
    return fenced


def _readable(family: Family) -> bool:
    if not available(family):
        return False
    try:
        table_read(family)
    except IptablesError:
        return False
    return True


def _install_lines(family: Family, table: Table) -> list[str]:
    """One transaction: the chain rewritten, every jump and INPUT rule moved to the top of its chain."""
    lines = gang_chain_lines(table.chains)  # before the fence's jump to it; kept as it is when it exists
    lines += [f":{CHAIN} - [0:0]"]  # created, or emptied if it exists
    if USER_CHAIN not in table.chains:
        lines += [f":{USER_CHAIN} - [0:0]", f"-A {USER_CHAIN} -j RETURN"]  # as Docker makes it
    lines += [f"-A {CHAIN} " + " ".join(rule) for rule in fence_rules(family)]
    placed = [*_jumps(), *(("INPUT", rule) for rule in _input_rules(family)), *_inbound()]
    for chain, rule in [*placed, *_retired()]:
        lines += [f"-D {chain} " + " ".join(rule)] * table.count(chain, rule)
    positions: dict[str, int] = {}
    for chain, rule in placed:
        positions[chain] = positions.get(chain, 0) + 1
        lines.append(f"-I {chain} {positions[chain]} " + " ".join(rule))
    return lines


def _nat_lines(table: Table) -> list[str]:
    """The nat table's part (IPv4): the gangs' chain made if missing, the jump to it moved to the top."""
    jump = _nat_jump()
    lines = gang_chain_lines(table.chains)
    lines += ["-D POSTROUTING " + " ".join(jump)] * table.count("POSTROUTING", jump)
    return [*lines, "-I POSTROUTING 1 " + " ".join(jump)]


def fence_problem() -> str | None:
    """Why the fence is not in place (None when it is): checked before every launch and every FENCE_CHECK_S."""
    for family in (IPV4, IPV6):
        if family is IPV6 and not ipv6_on_bridge():
            continue
        problem = family_problem(family)
        if problem:
            return f"{family.name}: {problem}"
    return None


def family_problem(family: Family) -> str | None:
    if not available(family):
        return f"{family.command} is missing on this host"
    try:
        table = table_read(family)
    except IptablesError as exc:
        return f"the filter table cannot be read ({exc})"
    bridge = settings.INSTANCE_BRIDGE
    if CHAIN not in table.chains:
        return f"the iptables chain {CHAIN} is missing"
    if not table.holds(CHAIN, fence_rules(family)):
        return f"the iptables chain {CHAIN} does not hold the fence's rules"
    for chain, jump in _jumps():
        position = table.find(chain, jump)
        if position is None:
            return f"{chain} does not send traffic from {bridge} to the fence"
        if rule := table.accepting(chain, bridge, before=position):
            return f"{chain} accepts traffic from {bridge} before the fence (`{' '.join(rule)}`)"
    for chain, rule in _inbound():
        if table.find(chain, rule) is None:
            return f"{chain} does not hold the fence's rule for traffic to {bridge} (`{' '.join(rule)}`)"
    if family is IPV4 and (problem := _nat_problem(family)):
        return problem
    ours = _input_rules(family)
    if any(table.find("INPUT", rule) is None for rule in ours):
        return f"INPUT does not hold the fence's rules for {bridge}"
    if rule := table.accepting("INPUT", bridge, before=table.find("INPUT", ours[-1]), ignore=ours):
        return f"INPUT accepts traffic from {bridge} before the fence (`{' '.join(rule)}`)"
    return None


def _nat_problem(family: Family) -> str | None:
    try:
        nat = table_read(family, "nat")
    except IptablesError as exc:
        return f"the nat table cannot be read ({exc})"
    if nat.find("POSTROUTING", _nat_jump()) != 0:
        return f"the nat table's POSTROUTING does not send the tenants' traffic to {GANGS_CHAIN} first"
    return None


def fence_check() -> None:
    problem = fence_problem()
    if problem:
        raise InvalidInput(f"the tenant network fence is not in place ({problem}): refusing to launch", field="network")


def fence_keep() -> str | None:
    """The periodic check: put the fence back when something moved or removed it; returns what was wrong."""
    problem = fence_problem()
    if problem:
        log.warning("the tenant network fence was out of place (%s): installing it again", problem)
        fence_install()
        if still := fence_problem():
            log.error("the tenant network fence is still not in place (%s): launches are refused", still)
    return problem


def fence_forever(stop: threading.Event) -> None:
    """Every FENCE_CHECK_S until ``stop``: a dockerd restart or an operator's rule never leaves it open for long."""
    while not stop.wait(settings.FENCE_CHECK_S):
        try:
            fence_keep()
        except Exception:  # Docker restarting, iptables busy: the next round tries again
            log.exception("checking the tenant network fence failed")
