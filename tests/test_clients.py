"""A process's shared Redis client is made once, however many threads ask for it first at once."""

import threading

import redis

from core import clients


def test_threads_that_ask_for_the_client_at_once_share_the_one_made(monkeypatch):
    made, both_making = [], threading.Barrier(2, timeout=2)
    from_url = redis.Redis.from_url

    def making(*args, **kwargs):
        made.append(threading.current_thread().name)
        try:
            both_making.wait()  # passes only if a second thread is making a client of its own meanwhile
        except threading.BrokenBarrierError:
            pass
        return from_url(*args, **kwargs)

    monkeypatch.setattr(clients, "_redis", None)
    monkeypatch.setattr(redis.Redis, "from_url", making)
    got = []
    threads = [threading.Thread(target=lambda: got.append(clients.redis_client())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    # With functools.cache both would make one, and the one replaced in the cache would close its
    # connection pool under the thread using it.
    assert len(made) == 1 and len(got) == 2 and got[0] is got[1]
    assert got[0].ping()
