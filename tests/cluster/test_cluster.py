"""Three GPU hosts, each with its own Docker engine and node agent, reaching the control plane over
a network: they register, the scheduler spreads work over them, each launches on its own engine,
and the agents' connections really come over the veths."""

import ipaddress
import os

import pytest
from django.conf import settings

from tests.cluster.harness import wait_until

pytestmark = pytest.mark.cluster

CARDS = {1: "RTX3090", 2: "A100-80GB", 3: "RTX3090"}  # the script's default: odd hosts 3090s, even A100s


def containers_by_host(cluster, hosts=(1, 2, 3)) -> dict[int, set[str]]:
    return {i: {c.id for c in cluster.engine(i).containers.list(all=True)} for i in hosts}


def test_three_hosts_register_with_their_addresses_and_cards(cluster):
    rows = cluster.sql(
        "SELECT n.name, n.status, n.address, n.relay_url, n.simulated, array_agg(g.model ORDER BY g.index) "
        "FROM scheduler_node n JOIN scheduler_gpu g ON g.node_id = n.id GROUP BY n.id ORDER BY n.name"
    )
    nodes = {name: rest for name, *rest in rows}
    assert set(nodes) >= {"h1", "h2", "h3"}
    for i, model in CARDS.items():
        status, address, relay_url, simulated, models = nodes[f"h{i}"]
        assert (status, address, simulated) == ("active", cluster.host_address(i), True)
        assert models == [model] * 4
        if hasattr(settings, "RELAY_PORT"):  # the relay is served on the host's own address
            assert f"//{address}:" in relay_url, relay_url


def test_the_scheduler_spreads_work_over_the_hosts_and_each_launches_on_its_own_engine(cluster):
    # Four cards each: one host's worth apiece, and the A100s exist only on h2.
    created = [cluster.create_instance(model, gpus=4) for model in ("RTX3090", "A100-80GB", "RTX3090")]
    try:
        running = [cluster.wait_instance(i["id"], "running") for i in created]
        assert sorted(r["node"] for r in running) == ["h1", "h2", "h3"]
        assert next(r["node"] for r in running if r["gpu_type"] == "A100-80GB") == "h2"
        containers = containers_by_host(cluster)
        for r in running:
            host = int(r["node"][1:])
            assert r["container_id"] in containers[host]
            assert all(r["container_id"] not in ids for i, ids in containers.items() if i != host)
            # On its host's fenced tenants' network.
            attrs = cluster.engine(host).containers.get(r["container_id"]).attrs
            address = attrs["NetworkSettings"]["Networks"]["gpucloud-tenants"]["IPAddress"]
            assert ipaddress.ip_address(address) in ipaddress.ip_network(cluster.tenant_subnet(host))
    finally:
        for i in created:
            cluster.release(i["id"])


def test_stop_start_and_release_of_an_instance_on_host_2_go_through_its_agent(cluster):
    instance = cluster.create_instance("A100-80GB")
    running = cluster.wait_instance(instance["id"], "running")
    assert running["node"] == "h2"
    h2 = cluster.engine(2)
    container = h2.containers.get(running["container_id"])
    assert container.status == "running"

    cluster.action(instance["id"], "stop")
    cluster.wait_instance(instance["id"], "stopped")
    container.reload()
    assert container.status == "exited"

    cluster.action(instance["id"], "start")
    again = cluster.wait_instance(instance["id"], "running")
    assert again["node"] == "h2"  # its disk is there
    assert again["container_id"] == container.id
    container.reload()
    assert container.status == "running"

    cluster.release(instance["id"])
    assert container.id not in {c.id for c in h2.containers.list(all=True)}
    assert all(container.id not in ids for ids in containers_by_host(cluster, (1, 3)).values())


def test_each_agent_runs_in_its_hosts_namespace_and_reaches_the_control_plane_over_the_veth(cluster):
    addresses = {cluster.host_address(i) for i in CARDS}
    for i in CARDS:
        agent = cluster.pid(f"h{i}-agent")
        assert os.stat(f"/proc/{agent}/ns/net").st_ino == os.stat(cluster.host_netns(i)).st_ino

    def node_role_clients():
        rows = cluster.sql(
            "SELECT host(client_addr) FROM pg_stat_activity WHERE usename LIKE %s", ("gpucloud\\_node\\_%",)
        )
        return {address for (address,) in rows}

    # Every agent holds a database connection from its host's address, and none from anywhere else
    # (no unix socket, no loopback).
    wait_until(lambda: node_role_clients() >= addresses, timeout=30, what="a database connection from every host")
    assert node_role_clients() <= addresses
    # Celery's broker connection and the channel layer: Redis sees the hosts' addresses too.
    clients = {c["addr"].rsplit(":", 1)[0] for c in cluster.redis().client_list()}
    assert addresses <= clients


def test_a_host_added_to_the_running_cluster_registers_and_takes_work(cluster):
    cluster.add_host(4, "sim:2xH100")
    rows = cluster.sql("SELECT status, address FROM scheduler_node WHERE name = 'h4'")
    assert rows == [("active", cluster.host_address(4))]
    cluster.catalog_forget()  # H100s exist now
    instance = cluster.create_instance("H100", gpus=2)
    try:
        running = cluster.wait_instance(instance["id"], "running")
        assert running["node"] == "h4"
        assert running["container_id"] in {c.id for c in cluster.engine(4).containers.list()}
    finally:
        cluster.release(instance["id"])
