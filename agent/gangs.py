"""A gang's members on this host: their addresses, their way through the fence to each other, and old copies.

Every member of a gang reaches every other on any port, at its container's address, and nothing else
does. The tenants' networks of the hosts are routed to each other (each host's ``INSTANCE_SUBNET`` via
that host: the operator's network, README "Deploying on real GPU servers"); the fence (``network.py``)
drops everything a tenant sends to private addresses, and Docker drops what reaches a container from
outside but its published ports. This module lets exactly the member pairs through, on both sides:

- Addresses: a member gets a fixed address on this host's tenants' network, chosen here before its
  container starts (``member_address_pick``: the highest one free; Docker gives containers without one
  the lowest free first) and recorded on its row, so every member knows rank 0's before it starts
  (``MASTER_ADDR``, rank 0 included) and the fence lets it through before its first packet. The other
  members start once rank 0's address is recorded (``agent.actions``; the control plane sends their
  launch again then).
- The chain ``GPUCLOUD-GANGS`` (filter): for each live member here and each live fellow member elsewhere,
  one rule accepting member -> fellow and one fellow -> member. The fence jumps to it for what leaves the
  tenants' bridge (before its drops); ``DOCKER-USER`` jumps to it for what goes to the bridge (after the
  fence's jump: ``network.py``), ahead of Docker's drop of what is not a published port. A packet crosses
  only where both hosts hold the pair: a rule left behind on one side, for an address that has gone to
  another container, lets nothing through.
- The chain ``GPUCLOUD-GANGS`` of the nat table, jumped to first from ``POSTROUTING``: the same pairs,
  member -> fellow, leave unmasqueraded, so a member sees its fellows' own addresses (gloo and NCCL
  advertise their interface's address; Docker's masquerade would show the host's instead).

Both chains are rewritten whole, one iptables-restore transaction each, from the database: before a
member's container starts, after every member's start and stop, when the control plane says a fellow
member moved (``ToNode.GANG_FENCE``) and at every reconcile, so a rule never outlives its member long.
"""

import ipaddress
import logging
import threading

from django.conf import settings

from agent import launcher
from agent.iptables import IPV4, IptablesError, table_apply
from scheduler.models import MemberStatus, WorkloadMember, WorkloadStatus
from scheduler.services import gangs as gang_service

log = logging.getLogger(__name__)

CHAIN = "GPUCLOUD-GANGS"
LIVE = MemberStatus.live()  # a leaving member keeps its way to its fellows through its grace

Pair = tuple[str, str, str]  # (this host's member's address, a fellow member's address, the gang's uid)


def gang_pairs(node_name: str) -> list[Pair]:
    """Every live member here with an address, with each live fellow member elsewhere that has one."""
    members = (
        WorkloadMember.objects.filter(
            node_name=node_name, status__in=LIVE, workload__status__in=WorkloadStatus.holding_resources()
        )
        .exclude(address="")
        .select_related("workload")
        .order_by("workload_id")
    )
    pairs = []
    for member in members:
        fellows = (
            WorkloadMember.objects.filter(workload_id=member.workload_id, status__in=LIVE)
            .exclude(node_name=node_name)
            .exclude(address="")
            .order_by("rank")
        )
        pairs += [
            (member.address, fellow.address, member.workload.uid)
            for fellow in fellows
            if _ipv4(member.address) and _ipv4(fellow.address)
        ]
    return pairs


def filter_rules(pairs: list[Pair]) -> list[list[str]]:
    """The filter chain's rules: each pair accepted both ways."""
    rules = []
    for member, fellow, uid in pairs:
        for source, destination in ((member, fellow), (fellow, member)):
            rules.append(["-s", f"{source}/32", "-d", f"{destination}/32", *_comment(uid), "-j", "ACCEPT"])
    return rules


def nat_rules(pairs: list[Pair]) -> list[list[str]]:
    """The nat chain's rules: what a member here sends a fellow leaves with its own address."""
    return [["-s", f"{mine}/32", "-d", f"{fellow}/32", *_comment(uid), "-j", "ACCEPT"] for mine, fellow, uid in pairs]


def _comment(uid: str) -> list[str]:
    return ["-m", "comment", "--comment", f"gang-{uid}"]


def _ipv4(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 4
    except ValueError:
        return False


def gang_rules_sync(node_name: str) -> int:
    """Rewrite both chains from the database (one transaction each); returns how many pairs they let through."""
    pairs = gang_pairs(node_name)
    try:
        table_apply(IPV4, _chain_lines(filter_rules(pairs)))
        table_apply(IPV4, _chain_lines(nat_rules(pairs)), table="nat")
    except IptablesError as exc:
        log.error("the gangs' way through the fence could not be written: %s", exc)
        raise
    return len(pairs)


def _chain_lines(rules: list[list[str]]) -> list[str]:
    return [f":{CHAIN} - [0:0]", *(f"-A {CHAIN} " + " ".join(rule) for rule in rules)]


def gang_rules_sync_logged(node_name: str) -> None:
    """The same where a failure must not stop the caller (a reconcile, a stop): the next reconcile retries."""
    try:
        gang_rules_sync(node_name)
    except IptablesError:
        pass  # logged by gang_rules_sync


def chain_lines(chains) -> list[str]:
    """What the fence's installation adds for this chain (filter or nat table): that it exists (empty at
    first; in the IPv6 tables it stays empty), never emptying it when the fence is installed again."""
    return [] if CHAIN in chains else [f":{CHAIN} - [0:0]"]


_picking = threading.Lock()  # one choice at a time on this host: two launches never take the same address


def member_address_pick(member: WorkloadMember) -> str:
    """A fixed address on this host's tenants' network for ``member``, recorded on its row before its
    container starts ("" when the member left starting meanwhile): the highest one free, where Docker
    gives containers without a fixed address the lowest free first and skips those taken."""
    with _picking:
        taken = launcher.network_addresses() | set(
            WorkloadMember.objects.filter(node_name=member.node_name, status__in=LIVE)
            .exclude(address="")
            .values_list("address", flat=True)
        )
        network = ipaddress.ip_network(settings.INSTANCE_SUBNET)
        lowest = int(network.network_address) + 2  # the network's own address and Docker's gateway (.1) are not
        for value in range(int(network.broadcast_address) - 1, lowest - 1, -1):
            address = str(ipaddress.ip_address(value))
            if address not in taken:
                return address if gang_service.member_address(member, address) else ""
    raise RuntimeError(f"no address is free on the tenants' network {settings.INSTANCE_SUBNET}")


def old_members_remove(workload, *, keep: str) -> None:
    """Containers of the gang's earlier placements on this engine, under another rank's name, go first
    (their output is in the log already): one container of the gang per host."""
    for state in launcher.containers_of(workload.uid):
        if state.name != keep:
            launcher.container_delete(state.name)
