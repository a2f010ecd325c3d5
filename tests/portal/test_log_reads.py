"""The per-user cap on log reads over HTTP: counted in Redis as leases, so it holds across web servers, and a
read frees its slot when it ends or its client goes."""

import pytest

from core.errors import TooMany
from portal.services import logs
from portal.services.logs import LogReadSlot
from tests.portal.test_jobs_and_preemption import submit_job


def url(job) -> str:
    return f"/api/v1/jobs/{job.pk}/logs/"


def free_slots(user_id: int) -> int:
    taken = []
    try:
        while len(taken) <= logs.LOG_READS_PER_USER:
            taken.append(LogReadSlot(user_id).take())
    except TooMany:
        pass
    finally:
        for slot in taken:
            slot.release()
    return len(taken)


@pytest.fixture
def cap(monkeypatch):
    monkeypatch.setattr(logs, "LOG_READS_PER_USER", 2)
    return 2


def test_a_read_beyond_the_users_cap_is_refused_saying_why_and_another_users_are_their_own(
    api, outsider_api, catalog, sim_node, user, cap
):
    job = submit_job(api, catalog)
    theirs = submit_job(outsider_api, catalog)
    held = [LogReadSlot(user.pk).take() for _ in range(cap)]  # e.g. downloads on other web servers

    refused = api.get(url(job))
    assert refused.status_code == 429
    assert refused.json()["detail"] == "you have 2 log reads under way, the most at once: wait until one of them ends"
    assert outsider_api.get(url(theirs)).status_code == 200

    held.pop().release()
    answer = api.get(url(job))
    assert answer.status_code == 200
    assert b'"end"' in b"".join(answer.streaming_content)
    held.pop().release()


def test_a_read_frees_its_slot_when_it_ends_and_when_its_client_goes(api, catalog, sim_node, user, cap):
    job = submit_job(api, catalog)
    answer = api.get(url(job))
    assert free_slots(user.pk) == 1  # held while it streams
    b"".join(answer.streaming_content)
    assert free_slots(user.pk) == 2

    cut = api.get(url(job))
    assert free_slots(user.pk) == 1
    cut.close()  # the client went before the end
    assert free_slots(user.pk) == 2
