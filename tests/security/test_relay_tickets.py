"""Relay tickets: the control plane signs them, a GPU host only checks them (issue 31 §1).

A host holds the public key (``relay.pub``); with it, and anything else a host has, it cannot make a
ticket that a relay takes — not for its own containers, not for another host's. The relay's side over
real HTTP is in tests/agent/test_relay.py; here the ticket itself, as a host that was taken would try it.
"""

import base64
import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from agent.relay import guard as relay_guard
from agent.relay.guard import Guard, Refused
from core import relay
from core.relay import TICKET_S, VOLUME_TICKET_S, Op, Ticket, TicketExpired, TicketRefused, ticket_open, ticket_sign

LISTING = Ticket(
    op=Op.LIST, container="gpucloud-x", workload=7, user=3, root="/root/autodl-tmp", path="/root/autodl-tmp"
)


def _public_pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture
def host_keys(tmp_path, settings):
    """A GPU host's keys folder as the deployment steps make it: make_signing_keys on the control plane, then
    everything but ``relay.key`` copied to the host. This process then signs as that host would."""
    control, host = tmp_path / "control", tmp_path / "host"
    settings.RELAY_SIGNING_KEY, settings.RELAY_VERIFY_KEY = str(control / "relay.key"), str(control / "relay.pub")
    settings.CELERY_SECURITY_KEY = str(control / "celery.key")
    settings.CELERY_SECURITY_CERTIFICATE = str(control / "certs" / "celery.pem")
    call_command("make_signing_keys", verbosity=0)
    signing_key = relay.signing_key()
    host.mkdir()
    (host / "relay.pub").write_bytes((control / "relay.pub").read_bytes())
    settings.RELAY_SIGNING_KEY, settings.RELAY_VERIFY_KEY = str(host / "relay.key"), str(host / "relay.pub")
    return SimpleNamespace(folder=host, control_key=signing_key)


def test_a_host_holds_no_key_that_signs_tickets(host_keys):
    with pytest.raises(ImproperlyConfigured, match="RELAY_SIGNING_KEY .* is missing"):
        ticket_sign(LISTING)
    # make_signing_keys run on a host does not make itself a signing key beside the control plane's public one
    call_command("make_signing_keys", verbosity=0)
    assert sorted(path.name for path in host_keys.folder.iterdir()) == ["relay.pub"]
    assert ticket_open(ticket_sign(LISTING, key=host_keys.control_key))[0] == LISTING  # the control plane's: taken


def test_a_ticket_signed_with_a_key_of_the_hosts_own_is_refused(host_keys):
    with pytest.raises(TicketRefused, match="not valid"):
        ticket_open(ticket_sign(LISTING, key=Ed25519PrivateKey.generate()))


def test_a_signed_ticket_changed_in_any_field_is_refused(host_keys):
    token = ticket_sign(LISTING, key=host_keys.control_key)
    body, _, signature = token.partition(".")
    fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    for change in ({"user": 4}, {"container": "gpucloud-y"}, {"ttl": 3600}, {"iat": fields["iat"] + 60}):
        changed = base64.urlsafe_b64encode(json.dumps(fields | change).encode()).rstrip(b"=").decode()
        with pytest.raises(TicketRefused, match="not valid"):
            ticket_open(f"{changed}.{signature}")
    for garbage in ("", ".", "x.y", f"{body}.", f"{body}.{signature}x", f"{body}x.{signature}", "é.é"):
        with pytest.raises(TicketRefused):
            ticket_open(garbage)


def test_a_ticket_lives_only_as_long_as_its_operation_may(host_keys, monkeypatch):
    key = host_keys.control_key
    with pytest.raises(TicketRefused, match="not valid"):  # even the control plane's key: not a long LIST ticket
        ticket_open(ticket_sign(LISTING, key=key, ttl=TICKET_S + 1))
    volume = dataclasses.replace(LISTING, op=Op.VOLUME, root="", path="", move=5)
    assert ticket_open(ticket_sign(volume, key=key, ttl=VOLUME_TICKET_S))[0] == volume
    with pytest.raises(TicketRefused, match="not valid"):
        ticket_open(ticket_sign(volume, key=key, ttl=VOLUME_TICKET_S + 1))
    real = time.time
    for shift, refused in ((-TICKET_S - 1, TicketExpired), (relay.CLOCK_SKEW_S + 5, TicketRefused)):
        with monkeypatch.context() as clock:
            clock.setattr(relay, "time", SimpleNamespace(time=lambda shift=shift: real() + shift))
            token = ticket_sign(LISTING, key=key)
        with pytest.raises(refused):
            ticket_open(token)


def test_a_new_verify_key_is_added_beside_the_old_one(host_keys, settings):
    """Rotating the control plane's key: hosts take both (one PEM after the other) until the old one goes."""
    new = Ed25519PrivateKey.generate()
    both = host_keys.folder / "both.pub"
    both.write_bytes((host_keys.folder / "relay.pub").read_bytes() + _public_pem(new))
    settings.RELAY_VERIFY_KEY = str(both)
    for key in (host_keys.control_key, new):
        assert ticket_open(ticket_sign(LISTING, key=key))[0] == LISTING
    settings.RELAY_VERIFY_KEY = str(host_keys.folder / "missing.pub")
    with pytest.raises(ImproperlyConfigured, match="RELAY_VERIFY_KEY"):
        Guard(node="n1", deployment="d", state_dir=host_keys.folder)  # an agent without one does not start


def test_a_moves_capability_is_spent_for_its_whole_life_even_across_restarts(host_keys, tmp_path, monkeypatch):
    """A VOLUME capability lives far longer than a minute: once used, it stays used until it has expired, also
    for an agent that restarted in between (its spent nonces are on its disk with their own expiry)."""
    volume = Ticket(op=Op.VOLUME, container="gpucloud-x", workload=7, user=3, move=5)
    header = f"Bearer {ticket_sign(volume, key=host_keys.control_key, ttl=VOLUME_TICKET_S)}"
    assert Guard(node="n1", deployment="d", state_dir=tmp_path)._ticket(header, Op.VOLUME) == volume
    real = time.time
    later = SimpleNamespace(time=lambda: real() + TICKET_S * 3)  # a short ticket would have been forgotten
    monkeypatch.setattr(relay, "time", later)
    monkeypatch.setattr(relay_guard, "time", later)
    with pytest.raises(Refused, match="used already"):
        Guard(node="n1", deployment="d", state_dir=tmp_path)._ticket(header, Op.VOLUME)


def test_a_moves_capability_is_taken_only_from_its_targets_address(host_keys, tmp_path):
    """It travels through the queue, which every host can read today: a copy used from anywhere but the target's
    registered address is refused, before it is spent (the thief cannot use it up for the target either)."""
    volume = Ticket(op=Op.VOLUME, container="gpucloud-x", workload=7, user=3, move=5, peer="10.0.0.12")
    header = f"Bearer {ticket_sign(volume, key=host_keys.control_key, ttl=VOLUME_TICKET_S)}"
    guard = Guard(node="n1", deployment="d", state_dir=tmp_path)
    for thief in ("10.0.0.13", "", "127.0.0.1"):
        with pytest.raises(Refused, match="for the host at 10.0.0.12"):
            guard._ticket(header, Op.VOLUME, remote=thief)
    assert guard._ticket(header, Op.VOLUME, remote="::ffff:10.0.0.12") == volume  # the target, IPv6-mapped
