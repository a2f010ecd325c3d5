"""A host's relay URL is its own to write (its agent registers it; its database role may rewrite it), so the web
tier and the other hosts call it only at the node's registered address: http(s)://<address>:<port>[/], no more.
Anything else is refused naming the node, and nothing is fetched (no SSRF through a compromised host)."""

import socket

import pytest

from agent import moves
from core.errors import Conflict, InvalidInput
from core.relay import Op, relay_base
from portal.services import files
from portal.services.logs import Query, log_lines
from portal.services.relay import relay_base_of, relay_target
from scheduler.models import Move, Node, WorkloadKind, WorkloadRun, WorkloadStatus
from scheduler.services.nodes import node_register
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db
S = WorkloadStatus
PIN = "ab" * 32  # a certificate's SHA-256 (hex)


class Listener:
    """A port on loopback that nothing should connect to: ``called()`` says whether anything did."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def called(self) -> bool:
        try:
            self.sock.accept()[0].close()
        except BlockingIOError:
            return False
        return True


@pytest.fixture
def listener():
    listener = Listener()
    yield listener
    listener.sock.close()


@pytest.mark.parametrize(
    ("address", "relay_url", "base"),
    [
        ("10.0.0.11", "http://10.0.0.11:8470", "http://10.0.0.11:8470"),
        ("10.0.0.11", "https://10.0.0.11:8470/", "https://10.0.0.11:8470"),
        ("gpu1.lan", "http://GPU1.lan.:8470", "http://gpu1.lan.:8470"),
        ("fd00::11", "http://[fd00:0::11]:8470", "http://[fd00:0::11]:8470"),
        ("", "http://127.0.0.1:8470", "http://127.0.0.1:8470"),  # registered without an address: this machine
    ],
)
def test_a_relay_at_the_nodes_address_with_a_port_is_called_there(address, relay_url, base):
    pin = PIN if relay_url.startswith("https") else ""  # a relay over TLS registers its certificate
    assert relay_base(node="gpu1", address=address, relay_url=relay_url, tls_sha256=pin) == base


@pytest.mark.parametrize(
    "relay_url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/#",
        "http://169.254.169.254:80/",
        "http://10.0.0.11:8470/latest/meta-data#",  # the right host, but a path of its own
        "http://10.0.0.11:8470/x",
        "http://10.0.0.11:8470#",
        "http://10.0.0.11:8470/?x=1",
        "http://10.0.0.11:8470?",
        "http://10.0.0.11",  # no port
        "http://user:pw@10.0.0.11:8470",
        "http://10.0.0.11:8470@169.254.169.254:80",
        "http://10.0.0.11:8470\\@169.254.169.254",
        "ftp://10.0.0.11:8470",
        "file:///etc/passwd",
        "gopher://10.0.0.11:8470/_SET",
        "http://10.0.0.11:99999",
        "http://10.0.0.110:8470",
        "10.0.0.11:8470",
        "",
    ],
)
def test_any_other_relay_url_is_refused_naming_the_node(relay_url):
    with pytest.raises(ValueError, match="host gpu1's relay address .* is not its registered address 10.0.0.11"):
        relay_base(node="gpu1", address="10.0.0.11", relay_url=relay_url)


def test_a_name_and_an_address_are_not_taken_for_each_other():
    with pytest.raises(ValueError, match="not its registered address gpu1.lan"):
        relay_base(node="gpu1", address="gpu1.lan", relay_url="http://10.0.0.11:8470")


def registered(name: str, **relay) -> Node:
    """Node ``name`` registered with no cards and the relay fields given."""
    return node_register(
        name=name,
        hostname="testhost",
        cpu_cores=8,
        memory_mb=16384,
        gpus=[],
        simulated=True,
        nvidia_runtime=False,
        **relay,
    )


def test_registration_refuses_a_relay_url_not_at_the_nodes_address_and_stores_nothing():
    node = make_node()
    with pytest.raises(InvalidInput, match=f"host {node.name}'s relay address") as refused:
        registered(node.name, address="10.0.0.11", relay_url="http://169.254.169.254/latest/meta-data#")
    assert refused.value.field == "relay_url"
    assert Node.objects.filter(pk=node.pk).values_list("address", "relay_url").get() == ("", "")


def test_a_relay_over_tls_without_its_certificate_registered_is_neither_registered_nor_called():
    with pytest.raises(InvalidInput) as refused:
        registered("tls-unpinned", relay_url="https://127.0.0.1:8470")
    assert refused.value.field == "relay_url" and "no certificate fingerprint" in refused.value.message
    node = make_node()
    node.relay_url, node.relay_tls_sha256 = "https://127.0.0.1:8470", ""
    with pytest.raises(Conflict, match="no certificate fingerprint"):
        relay_base_of(node)


def _on_forged_relay(user, listener, **fields):
    """Running work on a host whose relay URL (rewritten by the host) points at ``listener`` with a path."""
    node = make_node()
    Node.objects.filter(pk=node.pk).update(address="10.0.0.11", relay_url=f"http://127.0.0.1:{listener.port}/steal#")
    node.refresh_from_db()
    return workload(user, node=node, **{"status": S.RUNNING} | fields)


def test_the_web_tier_calls_no_relay_that_is_not_at_its_nodes_address(user, listener):
    w = _on_forged_relay(user, listener)
    with pytest.raises(Conflict, match=f"host {w.node.name}'s relay address .* not its registered address"):
        relay_target(workload=w, user=user, op=Op.LIST, root="/root", path="/root")
    with pytest.raises(Conflict, match=f"host {w.node.name}'s relay address"):
        files.listing(w, "/root", user=user)
    assert not listener.called()


def test_a_logs_read_calls_no_relay_that_is_not_at_its_nodes_address(user, listener):
    w = _on_forged_relay(user, listener, kind=WorkloadKind.JOB)
    WorkloadRun.objects.create(workload=w, number=1, node=w.node, node_name=w.node.name)
    with pytest.raises(Conflict, match=f"host {w.node.name}'s relay address"):
        list(log_lines(w, query=Query()))
    assert not listener.called()


def test_a_move_fetches_no_disk_from_a_source_relay_not_at_its_address(user, listener, settings):
    settings.REGISTRY = "127.0.0.1:5999"
    w = _on_forged_relay(user, listener, status=S.MOVING)
    move = Move.objects.create(workload=w, source=w.node, target=make_node())
    with pytest.raises(ValueError, match=f"host {w.node.name}'s relay address"):
        moves._fetch_into(move, "no-helper", "a-capability")
    assert not listener.called()
