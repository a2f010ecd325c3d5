"""The per-user cap on terminal and file sessions: counted in Redis, so it holds across web servers and hosts."""

import pytest

from core.errors import TooMany
from portal.services import relay
from portal.services.relay import SessionSlot
from tests.conftest import wait_for


@pytest.fixture
def cap(settings):
    settings.RELAY_MAX_SESSIONS_PER_USER = 2
    return 2


def test_a_users_sessions_are_capped_and_a_release_frees_one(cap, user, outsider):
    first, second = SessionSlot(user.pk).take(), SessionSlot(user.pk).take()  # e.g. two web servers
    with pytest.raises(TooMany, match="2 terminal and file sessions open"):
        SessionSlot(user.pk).take()
    SessionSlot(outsider.pk).take().release()  # another user's count is their own
    first.release()
    SessionSlot(user.pk).take().release()
    second.release()


def test_a_renewal_after_the_release_does_not_hold_the_slot_again(cap, user):
    slots = [SessionSlot(user.pk).take() for _ in range(cap)]
    slots[0].release()
    slots[0].renew()  # a renewal that was in flight when the session ended
    SessionSlot(user.pk).take().release()
    slots[1].release()


def test_the_slot_of_a_server_that_died_lapses_by_itself(settings, user, monkeypatch):
    settings.RELAY_MAX_SESSIONS_PER_USER = 1
    monkeypatch.setattr(relay, "LEASE_S", 0.5)
    SessionSlot(user.pk).take()  # never renewed nor released

    def free():
        try:
            SessionSlot(user.pk).take().release()
            return True
        except TooMany:
            return False

    assert not free()
    wait_for(free, timeout=10, what="the lease to lapse")


def test_a_relay_that_refuses_for_too_many_calls_answers_429_with_its_reason():
    refused = relay.refusal(429, b'{"detail": "this host\'s relay is busy: try again in a moment"}')
    assert isinstance(refused, TooMany) and refused.message == "this host's relay is busy: try again in a moment"
