"""A gang's members on this host: their way through the fence to rank 0, their checkpoint folder, old copies.

The tenants' fence (``network.py``) drops everything a tenant sends to private
addresses, other hosts included. A gang's members reach rank 0 at its host's
address, on the rendezvous port published there (``MASTER_PORT``); the fence lets
exactly that through, and only for the gang's own containers: for each member on
this host (rank 1 and up), one rule in the chain ``GPUCLOUD-GANGS`` accepts TCP
from that container's address to rank 0's host address and port. The fence jumps
to the chain right after letting replies through, before its drops; the chain is
rewritten whole, in one iptables-restore transaction, from the database after
every member's start and stop and at every reconcile, so a rule never outlives its
member. Nothing else crosses: another tenant on this host, or the same tenant's
other work, meets the fence as before; rank 0's host takes the connection on its
published port like any other (Docker's own rules).
"""

import ipaddress
import logging
import os
import shutil

from django.conf import settings

from scheduler.models import MemberStatus, WorkloadMember, WorkloadStatus
from scheduler.node import launcher
from scheduler.node.iptables import IPV4, IptablesError, table_apply
from scheduler.node.sharedfs import user_dir_on_host

log = logging.getLogger(__name__)

CHAIN = "GPUCLOUD-GANGS"


def gang_rules(node_name: str) -> list[list[str]]:
    """The chain's rules for this host's live members (rank 1 and up) of gangs that hold their cards."""
    members = (
        WorkloadMember.objects.filter(
            node_name=node_name,
            rank__gt=0,
            status__in=[MemberStatus.STARTING, MemberStatus.RUNNING],
            workload__status__in=WorkloadStatus.holding_resources(),
        )
        .exclude(address="")
        .select_related("workload__node")
        .order_by("workload_id")
    )
    rules = []
    for member in members:
        workload = member.workload
        master = workload.node.address if workload.node else ""
        if not (_ipv4(member.address) and _ipv4(master) and workload.master_port):
            continue
        rules.append(
            ["-s", f"{member.address}/32", "-d", f"{master}/32", "-p", "tcp", "-m", "tcp"]
            + ["--dport", str(workload.master_port), "-m", "comment", "--comment", f"gang-{workload.uid}"]
            + ["-j", "ACCEPT"]
        )
    return rules


def _ipv4(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 4
    except ValueError:
        return False


def gang_rules_sync(node_name: str) -> int:
    """Rewrite the chain from the database (one transaction); returns how many members it lets through."""
    rules = gang_rules(node_name)
    try:
        table_apply(IPV4, [f":{CHAIN} - [0:0]", *(f"-A {CHAIN} " + " ".join(rule) for rule in rules)])
    except IptablesError as exc:
        log.error("the gangs' way through the fence could not be written: %s", exc)
        raise
    return len(rules)


def gang_rules_sync_logged(node_name: str) -> None:
    """The same where a failure must not stop the caller (a reconcile, a stop): the next reconcile retries."""
    try:
        gang_rules_sync(node_name)
    except IptablesError:
        pass  # logged by gang_rules_sync


def chain_lines(chains) -> list[str]:
    """What the fence's installation adds for this chain: that it exists (empty at first; in the IPv6 table
    it stays empty), never emptying it when the fence is installed again."""
    return [] if CHAIN in chains else [f":{CHAIN} - [0:0]"]


def checkpoint_dir_ensure(workload) -> str:
    """The gang's checkpoint folder on the owner's shared storage (this host's mount of it); made if missing."""
    relative = launcher.checkpoint_dir(workload, gang=True)[len(settings.SHARED_FS_PATH.rstrip("/")) + 1 :]
    path = os.path.join(user_dir_on_host(workload.owner_id), relative)
    os.makedirs(path, exist_ok=True)
    return path


def checkpoint_dir_remove(workload) -> None:
    """Delete the gang's checkpoint folder from the shared storage (the job is deleted); none is fine."""
    path = os.path.join(
        user_dir_on_host(workload.owner_id),
        launcher.checkpoint_dir(workload, gang=True)[len(settings.SHARED_FS_PATH.rstrip("/")) + 1 :],
    )
    shutil.rmtree(path, ignore_errors=True)


def old_members_remove(workload, *, keep: str) -> None:
    """Containers of the gang's earlier placements on this engine, under another rank's name, go first
    (their output is in the log already): one container of the gang per host."""
    for state in launcher.containers_of(workload.uid):
        if state.name != keep:
            launcher.container_delete(state.name)
