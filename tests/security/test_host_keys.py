"""An identity per GPU host: each signs its Celery messages with its own key (``make_signing_keys --host``).

The control plane trusts every host's certificate and learns which host signed a message; a host trusts its own
and the control plane's only. A host may send only the control plane's tasks of ``HOST_MAY_SEND``, and the
replies about an operation only from the host it was sent to (``core.signing``).
"""

import logging
from pathlib import Path

import pytest
from celery.exceptions import SecurityError
from celery.security.certificate import Certificate
from celery.security.key import PrivateKey
from django.core.management import call_command

from core import signing
from core.messages import HOST_MAY_SEND, ToScheduler
from portal.models import Image, ImageStatus
from portal.services import images
from scheduler.models import Move, MoveStatus, WorkloadStatus
from scheduler.services.moves import move_report
from tests.conftest import make_node
from tests.scheduler.factories import workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def keys(tmp_path, settings):
    """A control plane's keys folder and two hosts' (h1, h2), made as the deployment steps make them."""
    plane = tmp_path / "plane"
    settings.KEYS_DIR = plane
    settings.CELERY_SECURITY_KEY = str(plane / "celery.key")
    settings.CELERY_SECURITY_CERTIFICATE = str(plane / "certs" / "celery.pem")
    settings.RELAY_SIGNING_KEY, settings.RELAY_VERIFY_KEY = str(plane / "relay.key"), str(plane / "relay.pub")
    settings.REGISTRY_TOKEN_KEY = str(plane / "registry-token.key")
    settings.REGISTRY_TOKEN_CERTIFICATE = str(plane / "registry-token.pem")
    for host in ("h1", "h2"):
        call_command("make_signing_keys", "--host", host, "--into", str(tmp_path / host), stdout=open("/dev/null", "w"))
    return tmp_path


def serializer(folder: Path) -> signing.SenderSerializer:
    """What a process with keys folder ``folder`` signs and checks with."""
    return signing.SenderSerializer(
        PrivateKey((folder / "celery.key").read_text()),
        Certificate((folder / "certs" / "celery.pem").read_text()),
        signing.HostCertStore(str(folder / "certs" / "*.pem")),
        "sha256",
    )


def task_body():
    return [[7], {}, {"callbacks": None}]


def test_the_control_plane_hears_which_host_signed_and_the_control_planes_own_messages_name_none(keys):
    plane = serializer(keys / "plane")
    from_h1 = plane.deserialize(serializer(keys / "h1").serialize(task_body()))
    assert from_h1[1] == {signing.SENT_BY: "h1"}
    assert plane.deserialize(plane.serialize(task_body()))[1] == {}
    assert sorted(p.name for p in (keys / "h1" / "certs").iterdir()) == ["celery.pem", "control-plane.pem"]
    assert not (keys / "h1" / "relay.key").exists() and (keys / "h1" / "relay.pub").exists()
    assert (keys / "plane" / "registry-token.key").exists(), "the control plane signs the registry's tokens"
    assert not list((keys / "h1").glob("registry-token*")), "a host asks for tokens, it never makes one"


def test_a_host_cannot_pass_a_message_off_as_the_control_planes_in_another_shape(keys):
    """Celery still runs task protocol 1 (a dict), which has no place for the signer's name: from a host, refused."""
    plane, h1 = serializer(keys / "plane"), serializer(keys / "h1")
    proto1 = {"task": ToScheduler.LEDGER_VERIFY, "id": "x", "args": [], "kwargs": {}}
    with pytest.raises(SecurityError, match="host h1 signed a message that is not a task call"):
        plane.deserialize(h1.serialize(proto1))
    assert plane.deserialize(plane.serialize(proto1)) == proto1  # the control plane's own, as before


def test_a_host_trusts_the_control_plane_and_itself_but_no_other_host(keys):
    h1 = serializer(keys / "h1")
    assert h1.deserialize(serializer(keys / "plane").serialize(task_body()))[1] == {}
    assert h1.deserialize(h1.serialize(task_body()))[1] == {signing.SENT_BY: "h1"}  # its own queue
    with pytest.raises(SecurityError, match="Unknown certificate"):
        h1.deserialize(serializer(keys / "h2").serialize(task_body()))


def test_a_host_added_later_is_heard_without_a_restart(keys):
    plane = serializer(keys / "plane")
    call_command("make_signing_keys", "--host", "h3", "--into", str(keys / "h3"), stdout=open("/dev/null", "w"))
    plane._cert_store._read_at -= signing.HostCertStore.RELOAD_S  # a second later
    assert plane.deserialize(serializer(keys / "h3").serialize(task_body()))[1] == {signing.SENT_BY: "h3"}


def test_a_hosts_keys_go_only_into_its_own_folder(keys, settings):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="control plane's keys folder"):
        call_command("make_signing_keys", "--host", "h9", "--into", str(settings.KEYS_DIR))
    with pytest.raises(CommandError, match="not a node name"):
        call_command("make_signing_keys", "--host", "../h9", "--into", str(keys / "x"))
    call_command("make_signing_keys", "--host", "GPU_9", "--into", str(keys / "GPU_9"), stdout=open("/dev/null", "w"))
    assert (keys / "plane" / "certs" / "host-GPU_9.pem").exists()  # any node name (a slug)


def test_a_host_may_send_the_control_plane_only_its_replies_and_nudges(caplog):
    from billing import tasks

    ran = []
    settle = tasks.settle_usage  # allowed: it settles from the control plane's own records
    verify = tasks.ledger_verify  # not allowed
    assert ToScheduler.SETTLE_USAGE in HOST_MAY_SEND and ToScheduler.LEDGER_VERIFY not in HOST_MAY_SEND

    def run(*args, **kwargs):
        ran.append(signing.sent_by())

    for task in (settle, verify):
        original, task.run = task.run, run
        try:
            with caplog.at_level(logging.WARNING, logger="core.signing"):
                task(**{signing.SENT_BY: "h1"})
                task()
        finally:
            task.run = original
    assert ran == ["h1", None, None]  # the host's settle, the control plane's settle, the control plane's verify
    assert f"refused {ToScheduler.LEDGER_VERIFY} from host h1" in caplog.text


def test_a_reply_about_an_image_is_taken_only_from_its_node(user):
    node, other = make_node("sim:1xRTX3090"), make_node("sim:1xRTX3090")
    image = Image.objects.create(
        name="env",
        framework="PyTorch",
        framework_version="2",
        cuda_version="12",
        owner=user,
        status=ImageStatus.SAVING,
        node=node,
        docker_ref="r/x:1",
        visibility="private",
    )
    images.image_saved(image.pk, 10, "", host=other.name)
    image.refresh_from_db()
    assert image.status == ImageStatus.SAVING
    images.image_saved(image.pk, 10, "", host=node.name)
    image.refresh_from_db()
    assert image.status == ImageStatus.READY


def test_a_move_report_is_taken_from_its_source_and_target_each_for_its_own_side(user):
    source, target, other = (make_node("sim:1xRTX3090") for _ in range(3))
    w = workload(user, status=WorkloadStatus.MOVING, node=source)
    move = Move.objects.create(workload=w, source=source, target=target)

    move_report(move.pk, {"error": "forged"}, host=other.name)  # a third host
    move_report(move.pk, {"received_sha256": "a" * 64}, host=source.name)  # the target's word, from the source
    move_report(move.pk, {"sent_sha256": "a" * 64}, host=target.name)  # the source's word, from the target
    move.refresh_from_db()
    assert move.status == MoveStatus.COPYING and not move.sent_sha256 and not move.received_sha256

    move_report(move.pk, {"phase": "copying", "sent_sha256": "b" * 64}, host=source.name)
    move_report(move.pk, {"received_sha256": "c" * 64}, host=target.name)
    move.refresh_from_db()
    assert (move.sent_sha256, move.received_sha256) == ("b" * 64, "c" * 64)


def test_a_host_folder_given_the_control_planes_keys_before_gets_its_own(keys):
    """Hosts were once given a copy of the control plane's folder: made again, it holds the host's own pair and
    trusts no other host."""
    import shutil

    old = keys / "old-h1"
    shutil.copytree(keys / "plane", old)  # celery.key, certs/celery.pem and the hosts' certificates
    call_command("make_signing_keys", "--host", "h1", "--into", str(old), stdout=open("/dev/null", "w"))
    assert (old / "celery.key").read_bytes() != (keys / "plane" / "celery.key").read_bytes()
    assert sorted(p.name for p in (old / "certs").iterdir()) == ["celery.pem", "control-plane.pem"]
    assert not (old / "relay.key").exists()
    assert serializer(keys / "plane").deserialize(serializer(old).serialize(task_body()))[1] == {signing.SENT_BY: "h1"}
