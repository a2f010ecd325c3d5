"""The fence's order check on filter tables as iptables -S prints them (Docker's layout among them)."""

import shlex

from scheduler.node.iptables import Table, canonical

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
