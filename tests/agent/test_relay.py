"""The node's relay serves only what the control plane signed, for this node's own containers.

No ticket, a forged, expired or already used one: 401. A ticket for another
operation or a path out of its root: 403. A container of another node, another
deployment, or another owner than the ticket names: 403; one not there: 404;
one that does not run: 409. Against a real container, over real HTTP. And the tar
pieces the transfers stream through, on their own.
"""

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import signal
import ssl
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.launcher import docker_client
from agent.relay import guard as relay_guard
from agent.relay import server as relay_server
from agent.relay.server import RelayServer
from agent.relay.streams import file_from_tar, tar_of_one_file
from core import relay
from core.errors import Conflict, InvalidInput
from core.relay import Op, Ticket, ticket_sign
from core.relay_tls import relay_http, wrong_certificate
from portal.models import Instance
from portal.services import files
from tests.conftest import wait_for, wait_status
from tests.portal.test_instance_api import create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def workload(api, catalog, node_worker):
    assert create(api, catalog).status_code == 201
    return wait_status(Instance.objects.get().workload, "running", timeout=30)


def listing(of, **changes) -> Ticket:
    """A ticket to list the data disk of workload ``of``, with ``changes``."""
    ticket = Ticket(
        op=Op.LIST,
        container=of.container_name,
        workload=of.pk,
        user=of.owner_id,
        root="/root/autodl-tmp",
        path="/root/autodl-tmp",
    )
    return dataclasses.replace(ticket, **changes)


def call(relay: RelayServer, op: Op, token: str | None, method: str = "GET") -> requests.Response:
    """One request to ``relay``, over TLS pinned to its certificate, as the web tier makes it."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return relay_http(relay.tls_sha256).request(method, f"{relay.url}/v1/{op}", headers=headers, timeout=30)


def signed(ticket: Ticket) -> str:
    return ticket_sign(ticket)


@pytest.fixture
def other_relay(sim_node):
    """A relay of another node, on the same Docker engine (as if it were another host's)."""
    relay = RelayServer(f"{sim_node.name}-other", api=docker_client().api, host="127.0.0.1", port=0)
    relay.start()
    yield relay
    relay.stop()


def test_a_signed_ticket_lists_the_folder_once(workload, node_relay, settings):
    token = signed(listing(workload))
    answer = call(node_relay, Op.LIST, token)
    assert answer.status_code == 200 and json.loads(answer.text.splitlines()[-1]) == {"end": True}
    replay = call(node_relay, Op.LIST, token)
    assert replay.status_code == 401 and "used already" in replay.json()["detail"]


def test_no_ticket_a_forged_or_an_expired_one_is_refused_with_401(workload, node_relay, monkeypatch):
    assert call(node_relay, Op.LIST, None).status_code == 401
    assert call(node_relay, Op.TERMINAL, None).status_code == 401
    forged = ticket_sign(listing(workload), key=Ed25519PrivateKey.generate())
    assert call(node_relay, Op.LIST, forged).json() == {"detail": "the ticket is not valid"}
    with monkeypatch.context() as past:
        past.setattr(relay, "time", SimpleNamespace(time=lambda: time.time() - 120))
        expired = signed(listing(workload))
    answer = call(node_relay, Op.LIST, expired)
    assert answer.status_code == 401 and answer.json() == {"detail": "the ticket has expired"}


def test_a_spent_ticket_stays_spent_when_the_agent_restarts(tmp_path):
    """A ticket is good for one request, also across a restart of the agent (issue 31 §1): the nonces spent in
    the last minute are on disk, read back by the next Guard; expired ones are forgotten."""
    ticket = Ticket(op=Op.LIST, container="c", workload=1, user=1, root="/root/autodl-tmp", path="/root/autodl-tmp")
    header = f"Bearer {signed(ticket)}"

    def guard():
        return relay_guard.Guard(node="n1", deployment="d", state_dir=tmp_path)

    first = guard()
    assert first._ticket(header, Op.LIST).nonce == ticket.nonce
    with pytest.raises(relay_guard.Refused, match="used already"):
        first._ticket(header, Op.LIST)
    restarted = guard()
    with pytest.raises(relay_guard.Refused, match="used already"):
        restarted._ticket(header, Op.LIST)
    other = dataclasses.replace(ticket, nonce="another-one")
    assert restarted._ticket(f"Bearer {signed(other)}", Op.LIST)
    spent = tmp_path / "n1" / "relay-spent-tickets"
    spent.write_text(f"{time.time() - 1:.0f} long-expired\n" + spent.read_text())
    assert "long-expired" not in guard()._spent._until and "long-expired" not in spent.read_text()


def test_a_ticket_for_another_operation_or_a_path_out_of_its_root_is_refused_with_403(workload, node_relay, settings):
    assert call(node_relay, Op.DOWNLOAD, signed(listing(workload))).status_code == 403
    for root, path in [("/root/autodl-tmp", "/etc"), ("/etc", "/etc"), ("/root/autodl-tmp", "/root/autodl-tmp/../x")]:
        answer = call(node_relay, Op.LIST, signed(listing(workload, root=root, path=path)))
        assert answer.status_code == 403, (root, path)


def test_a_container_of_another_node_deployment_or_owner_is_refused_with_403(
    workload, node_relay, other_relay, settings, outsider
):
    assert call(other_relay, Op.LIST, signed(listing(workload))).status_code == 403
    assert call(node_relay, Op.LIST, signed(listing(workload, user=outsider.pk))).status_code == 403
    assert call(node_relay, Op.LIST, signed(listing(workload, workload=workload.pk + 1))).status_code == 403
    settings.DEPLOYMENT_ID = "another-deployment"
    elsewhere = RelayServer(node_relay.node, api=docker_client().api, host="127.0.0.1", port=0)
    elsewhere.start()
    try:
        assert call(elsewhere, Op.LIST, signed(listing(workload))).status_code == 403
    finally:
        elsewhere.stop()


def test_a_missing_container_is_404_and_a_stopped_one_409(workload, node_relay, settings):
    missing = call(node_relay, Op.LIST, signed(listing(workload, container="gpucloud-no-such")))
    assert missing.status_code == 404
    docker_client().containers.get(workload.container_name).stop(timeout=1)
    assert call(node_relay, Op.LIST, signed(listing(workload))).status_code == 409


def test_an_ended_jobs_ticket_reads_an_ended_job_of_its_owner_only(workload, node_relay, settings):
    """A ticket for an ended job's disk (``ended``) names a job of its owner that has ended on this node: not an
    instance, not another owner's, and only to list or download (tests/portal/test_ended_job_files.py reads one)."""
    ticket = listing(workload, ended=True, root="/root", path="/root/checkpoints")
    not_a_job = call(node_relay, Op.LIST, signed(ticket))
    assert not_a_job.status_code == 404 and "no job" in not_a_job.json()["detail"]
    upload = dataclasses.replace(ticket, op=Op.UPLOAD, name="x", size=1, nonce="another")
    assert call(node_relay, Op.UPLOAD, signed(upload), method="PUT").status_code == 403


@pytest.mark.parametrize("form", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_a_file_is_unpacked_from_a_tar_stream_cut_anywhere(form):
    body = bytes(range(256)) * 4099
    name = "n" * (99 if form == tarfile.USTAR_FORMAT else 180) + "-é"[: 1 if form == tarfile.USTAR_FORMAT else 2]
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w", format=form) as archive:
        info = tarfile.TarInfo(name)
        info.size = len(body)
        archive.addfile(info, io.BytesIO(body))
    data = packed.getvalue()
    pieces = [data[i : i + 7919] for i in range(0, len(data), 7919)]  # chunk edges fall anywhere
    member, *chunks = file_from_tar(pieces)
    assert member.size == len(body) and b"".join(chunks) == body


def test_a_link_or_a_folder_in_the_stream_is_not_a_file_and_a_short_stream_is_refused():
    for kind in (tarfile.SYMTYPE, tarfile.DIRTYPE):
        packed = io.BytesIO()
        with tarfile.open(fileobj=packed, mode="w") as archive:
            info = tarfile.TarInfo("x")
            info.type, info.linkname = kind, "/etc/passwd"
            archive.addfile(info)
        with pytest.raises(InvalidInput, match="not a regular file"):
            next(file_from_tar([packed.getvalue()]))
    cut = b"".join(tar_of_one_file("f", 10_000, [b"x" * 10_000]))[:5000]
    with pytest.raises(InvalidInput, match="ended early"):
        list(file_from_tar([cut]))


def test_an_upload_is_packed_on_the_fly_and_must_be_as_long_as_announced():
    packed = b"".join(tar_of_one_file("data.bin", 1500, [b"a" * 1000, b"b" * 500]))
    with tarfile.open(fileobj=io.BytesIO(packed)) as archive:
        assert archive.extractfile("data.bin").read() == b"a" * 1000 + b"b" * 500
    with pytest.raises(InvalidInput, match="longer"):
        list(tar_of_one_file("f", 10, [b"x" * 11]))
    with pytest.raises(InvalidInput, match="ended after 9 of 10"):
        list(tar_of_one_file("f", 10, [b"x" * 9]))


def shell_replaced(workload, script: str) -> None:
    """The tenant's ``sh`` (what a listing runs in the container, and BusyBox's runs its own ``find``) replaced by
    ``script``: he is root in there."""
    container = docker_client().containers.get(workload.container_name)
    replace = 'rm -f /bin/sh && printf "#!/bin/busybox sh\\n%s\\n" "$1" > /bin/sh && chmod +x /bin/sh'
    code, out = container.exec_run(["/bin/busybox", "sh", "-c", replace, "sh", script])
    assert code == 0, out


def processes(workload, command: str) -> list[int]:
    """The host pids of the container's processes whose command line starts with ``command``."""
    listed = docker_client().api.top(workload.container_name)
    pid, cmd = listed["Titles"].index("PID"), listed["Titles"].index("CMD")
    return [int(row[pid]) for row in listed["Processes"] if row[cmd].startswith(command)]


def test_a_listing_that_never_ends_its_line_is_refused_at_once_and_its_process_is_killed(
    workload, node_relay, settings
):
    shell_replaced(workload, "exec tr '\\0' x < /dev/zero")  # tens of MB a second, never a newline, never an end
    began = time.monotonic()
    answer = call(node_relay, Op.LIST, signed(listing(workload)))
    last = json.loads(answer.text.splitlines()[-1])
    assert "longer than" in last["error"] and time.monotonic() - began < 10, (last, time.monotonic() - began)
    wait_for(lambda: not processes(workload, "tr "), what="the listing's process to be killed", timeout=10)


def test_a_listing_past_its_time_limit_has_its_process_killed(workload, node_relay, settings, monkeypatch):
    monkeypatch.setattr(relay_server, "LIST_TIMEOUT_S", 2)
    shell_replaced(workload, "exec sleep 600")  # silent, and never ending
    with contextlib.suppress(requests.RequestException):  # 504, or cut short: the HTTP side ends either way
        call(node_relay, Op.LIST, signed(listing(workload)))
    wait_for(lambda: not processes(workload, "sleep 600"), what="the listing's process to be killed", timeout=10)


def test_relay_calls_beyond_a_users_or_the_hosts_share_of_its_threads_are_refused_with_429(
    workload, node_relay, settings, monkeypatch
):
    shell_replaced(workload, "exec sleep 600")  # a listing that holds one of the relay's threads
    settings.RELAY_MAX_SESSIONS_PER_USER = 1
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(call, node_relay, Op.LIST, signed(listing(workload)))
        wait_for(lambda: processes(workload, "sleep 600"), what="the first listing to run")
        refused = call(node_relay, Op.LIST, signed(listing(workload)))
        assert refused.status_code == 429 and "at once" in refused.json()["detail"], refused.text
        settings.RELAY_MAX_SESSIONS_PER_USER = 8
        monkeypatch.setattr(relay_guard, "THREADS", 1)
        refused = call(node_relay, Op.LIST, signed(listing(workload)))
        assert refused.status_code == 429 and "busy" in refused.json()["detail"], refused.text
        for pid in processes(workload, "sleep 600"):
            os.kill(pid, signal.SIGKILL)
        assert first.result().status_code == 200
    docker_client().containers.get(workload.container_name).exec_run(
        ["/bin/busybox", "ln", "-sf", "busybox", "/bin/sh"]
    )
    wait_for(
        lambda: call(node_relay, Op.LIST, signed(listing(workload))).status_code == 200,
        what="the thread to be free again",
        timeout=10,
    )


def test_the_relay_serves_tls_with_the_certificate_it_registered_and_keeps_it_across_a_restart(node_relay, sim_node):
    assert node_relay.url.startswith("https://")
    host, port = node_relay.url.removeprefix("https://").rsplit(":", 1)
    served = ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate((host, int(port))))
    assert hashlib.sha256(served).hexdigest() == node_relay.tls_sha256 == sim_node.relay_tls_sha256
    with pytest.raises(requests.ConnectionError):  # nothing in the clear
        requests.get(f"http://{host}:{port}/v1/list", timeout=10)
    again = RelayServer(sim_node.name, api=docker_client().api, host="127.0.0.1", port=0)
    again.start()
    try:
        assert again.tls_sha256 == node_relay.tls_sha256  # the host's key is kept (AGENT_STATE_DIR)
    finally:
        again.stop()


def test_a_caller_refuses_a_relay_that_does_not_present_the_registered_certificate(workload, other_relay, sim_node):
    """Someone else answering at the relay's address (here another host's relay: its own key) gets no ticket's
    answer through: the web tier pins the certificate the host registered, not any certificate."""
    sim_node.relay_url = other_relay.url  # same address (loopback), another server
    sim_node.save(update_fields=["relay_url"])
    with pytest.raises(requests.exceptions.SSLError) as refused:
        relay_http(sim_node.relay_tls_sha256).get(f"{other_relay.url}/v1/list", timeout=10)
    assert wrong_certificate(refused.value)
    with pytest.raises(Conflict, match="did not present the certificate it registered"):
        files.listing(workload, "/root/autodl-tmp", user=workload.owner)
