"""The fence's order check on filter tables as iptables -S prints them (Docker's layout among them), and the
rules the fence and the gangs' way through it write."""

import shlex

from agent import network
from agent.iptables import IPV4, Table, canonical

BRIDGE = "gpucloud0"


def table(listing: str) -> Table:
    chains: dict = {}
    for line in listing.strip().splitlines():
        words = shlex.split(line)
        chains.setdefault(words[1], [])
        if words[0] == "-A":
            chains[words[1]].append(tuple(words[2:]))
    return Table(chains)


# Docker 20.10 with its iptables on, the tenants' bridge among its networks.
DOCKER = table(f"""
-P FORWARD ACCEPT
-N DOCKER
-N DOCKER-ISOLATION-STAGE-1
-N DOCKER-ISOLATION-STAGE-2
-N DOCKER-USER
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-ISOLATION-STAGE-1
-A FORWARD -o {BRIDGE} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -o {BRIDGE} -j DOCKER
-A FORWARD -i {BRIDGE} ! -o {BRIDGE} -j ACCEPT
-A FORWARD -i {BRIDGE} -o {BRIDGE} -j DROP
-A DOCKER -d 10.213.0.2/32 ! -i {BRIDGE} -o {BRIDGE} -p tcp -m tcp --dport 8888 -j ACCEPT
-A DOCKER-ISOLATION-STAGE-1 -i {BRIDGE} ! -o {BRIDGE} -j DOCKER-ISOLATION-STAGE-2
-A DOCKER-ISOLATION-STAGE-1 -j RETURN
-A DOCKER-ISOLATION-STAGE-2 -o {BRIDGE} -j DROP
-A DOCKER-ISOLATION-STAGE-2 -j RETURN
-A DOCKER-USER -j RETURN
""")


def test_nothing_accepts_ahead_of_docker_user_in_dockers_own_layout():
    assert DOCKER.find("FORWARD", ["-j", "DOCKER-USER"]) == 0
    assert DOCKER.accepting("FORWARD", BRIDGE, before=0) is None
    # Replies, other traffic to the bridge, chains that only drop: none lets a tenant's new connection out.
    assert DOCKER.accepting("FORWARD", BRIDGE, before=4) is None
    assert DOCKER.accepting("FORWARD", BRIDGE, before=5) == ("-i", BRIDGE, "!", "-o", BRIDGE, "-j", "ACCEPT")


def test_an_accept_is_seen_through_the_chains_it_is_reached_by():
    t = table(f"""
-P INPUT ACCEPT
-N SOMEONES
-A INPUT -j SOMEONES
-A INPUT -i {BRIDGE} -j DROP
-A SOMEONES -p tcp --dport 22 -j ACCEPT
""")
    assert t.accepting("INPUT", BRIDGE, before=1) == ("-j", "SOMEONES")


def test_rules_for_other_interfaces_do_not_count_and_wildcards_and_negations_do():
    t = table(f"""
-P INPUT ACCEPT
-A INPUT -i lo -j ACCEPT
-A INPUT ! -i {BRIDGE} -j ACCEPT
-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A INPUT -i gpu+ -j ACCEPT
-A INPUT ! -i eth0 -j ACCEPT
""")
    assert t.accepting("INPUT", BRIDGE, before=3) is None
    assert t.accepting("INPUT", BRIDGE, before=4) == ("-i", "gpu+", "-j", "ACCEPT")
    assert t.accepting("INPUT", BRIDGE, before=5, ignore=[["-i", "gpu+", "-j", "ACCEPT"]]) == (
        "!",
        "-i",
        "eth0",
        "-j",
        "ACCEPT",
    )


def test_rules_compare_as_iptables_prints_them():
    assert canonical(["-d", "::ffff:0:0/96", "-j", "DROP"]) == canonical(["-d", "::ffff:0.0.0.0/96", "-j", "DROP"])
    assert canonical(["-d", "203.0.113.7", "-j", "DROP"]) == canonical(["-d", "203.0.113.7/32", "-j", "DROP"])
    assert canonical(["--ctstate", "ESTABLISHED,RELATED"]) == canonical(["--ctstate", "RELATED,ESTABLISHED"])
    assert DOCKER.count("FORWARD", ["-j", "DOCKER-USER"]) == 1


# Docker 20.10's nat table for the tenants' network, and the agent's own jump ahead of its masquerade.
NAT = table("""
-P POSTROUTING ACCEPT
-N DOCKER
-N GPUCLOUD-GANGS
-A POSTROUTING -s 10.213.0.0/16 -j GPUCLOUD-GANGS
-A POSTROUTING -s 10.213.0.0/16 ! -o gpucloud0 -j MASQUERADE
-A POSTROUTING -s 10.213.0.0/16 -j GPUCLOUD-GANGS
""")


def test_what_goes_to_the_bridge_passes_as_a_gangs_pair_a_reply_or_a_published_port_and_is_dropped_else(settings):
    settings.INSTANCE_BRIDGE = BRIDGE
    lines = network._install_lines(IPV4, DOCKER)
    assert f"-I DOCKER-USER 1 -i {BRIDGE} -j GPUCLOUD-FENCE" in lines
    assert f"-I DOCKER-USER 2 -o {BRIDGE} -j GPUCLOUD-GANGS" in lines
    drop = f"-I DOCKER-USER 3 -o {BRIDGE} -m conntrack ! --ctstate ESTABLISHED,RELATED,DNAT -j DROP"
    assert drop in lines  # another host routing to a tenant's unpublished port, with FORWARD's policy ACCEPT
    assert ":GPUCLOUD-GANGS - [0:0]" in lines  # made where missing (an existing one keeps its rules)
    # Ahead of Docker's drop of what is not a published port: FORWARD reaches DOCKER-USER first.
    assert DOCKER.find("FORWARD", ["-j", "DOCKER-USER"]) == 0


def test_the_gangs_nat_jump_goes_first_once_and_keeps_the_chain(settings):
    settings.INSTANCE_SUBNET = "10.213.0.0/16"
    lines = network._nat_lines(NAT)
    jump = "-s 10.213.0.0/16 -j GPUCLOUD-GANGS"
    assert lines == [f"-D POSTROUTING {jump}", f"-D POSTROUTING {jump}", f"-I POSTROUTING 1 {jump}"]
    assert network._nat_lines(table("-P POSTROUTING ACCEPT"))[0] == ":GPUCLOUD-GANGS - [0:0]"


def test_a_fence_without_the_gangs_jumps_is_out_of_place(settings, monkeypatch):
    settings.INSTANCE_BRIDGE, settings.INSTANCE_SUBNET = BRIDGE, "10.213.0.0/16"
    inbound = [tuple(rule) for _, rule in network._inbound()]
    docker_user = [("-i", BRIDGE, "-j", "GPUCLOUD-FENCE"), *inbound, ("-j", "RETURN")]
    chains = {
        **DOCKER.chains,
        "DOCKER-USER": docker_user,
        "GPUCLOUD-FENCE": [tuple(rule) for rule in network.fence_rules(IPV4)],
        "GPUCLOUD-GANGS": [],
        "INPUT": [tuple(rule) for rule in network._input_rules(IPV4)],
    }
    nat = {"POSTROUTING": list(NAT.chains["POSTROUTING"][:2])}
    tables = {"filter": Table(chains), "nat": Table(nat)}
    monkeypatch.setattr(network, "table_read", lambda family, name="filter": tables[name])
    monkeypatch.setattr(network, "available", lambda family: True)
    assert network.family_problem(IPV4) is None
    tables["nat"] = Table({"POSTROUTING": nat["POSTROUTING"][::-1]})  # Docker's masquerade first
    assert "POSTROUTING" in network.family_problem(IPV4)
    tables["nat"] = Table(nat)
    chains["DOCKER-USER"] = [docker_user[0], docker_user[1], docker_user[3]]
    assert "DOCKER-USER does not hold the fence's rule for traffic to" in network.family_problem(IPV4)
    assert "ESTABLISHED,RELATED,DNAT" in network.family_problem(IPV4)
