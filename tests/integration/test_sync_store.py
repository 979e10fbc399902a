"""The durable revoke store against a real Redis: atomic, idempotent, bounded, self-trimming.

No worker and no broker here (the store is Redis whatever the broker), so these
tests are not parametrized over brokers; a fake wall clock drives expiry.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from celery_extras.sync.digest import Pull, plan_pull
from celery_extras.sync.revoke_store import WRITE_CHUNK, RevokeStore
from tests.support.brokers import REDIS_URL


class Wall:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client() -> redis.Redis[str]:
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


@pytest.fixture
def prefix(client: redis.Redis[str]) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    for key in client.scan_iter(f"{name}:*"):
        client.delete(key)


def test_writes_are_idempotent_and_pulls_return_only_the_changes(
    client: redis.Redis[str], prefix: str
) -> None:
    wall = Wall()
    store = RevokeStore(client, prefix, max_entries=100, wall_clock=wall)
    assert store.add({"a": wall.now + 10, "b": wall.now + 20}, {("h", "v"): wall.now + 30}) == 3
    assert store.add({"a": wall.now + 10}) == 0  # same revoke again: nothing changes
    assert store.add({"a": wall.now + 5}) == 0  # an earlier expiry never shortens one
    everything = store.pull()
    assert everything.ids.kept == {"a": wall.now + 10, "b": wall.now + 20}
    assert everything.stamps.kept == {("h", "v"): wall.now + 30}
    cursor = everything.version
    assert cursor.seq == 3

    assert store.add({"a": wall.now + 50, "c": wall.now + 50}) == 2
    version, _ = store.probe()
    assert plan_pull(cursor, version) is Pull.CHANGES
    changes = store.pull(cursor.seq)
    assert changes.ids.kept == {"a": wall.now + 50, "c": wall.now + 50}
    assert changes.stamps.kept == {}
    assert plan_pull(changes.version, store.probe()[0]) is Pull.NOTHING


def test_store_trims_expired_entries_and_evicts_beyond_its_bound(
    client: redis.Redis[str], prefix: str
) -> None:
    wall = Wall()
    store = RevokeStore(client, prefix, max_entries=3, wall_clock=wall)
    store.add({f"id{i}": wall.now + 10 + i for i in range(5)})
    assert store.counts()["ids"] == 3
    assert set(store.pull().ids.kept) == {"id2", "id3", "id4"}  # soonest-expiring evicted
    wall.now += 12.5
    store.probe()
    assert store.counts()["ids"] == 2  # id2 expired and trimmed
    assert client.zcard(store.keys[2]) == 2  # its change-log entry went with it
    wall.now += 100
    assert store.add({"late": wall.now + 1}) == 1
    assert store.counts()["ids"] == 1


def test_clock_is_the_highest_reported(client: redis.Redis[str], prefix: str) -> None:
    store = RevokeStore(client, prefix, max_entries=10)
    assert store.probe(clock=41)[1] == 41
    assert store.probe(clock=7)[1] == 41
    assert store.pull(clock=99).clock == 99


def test_emptied_store_gets_a_new_epoch_and_a_full_pull(
    client: redis.Redis[str], prefix: str
) -> None:
    wall = Wall()
    store = RevokeStore(client, prefix, max_entries=10, wall_clock=wall)
    store.add({"a": wall.now + 10})
    cursor = store.pull().version
    for key in store.keys:
        client.delete(key)
    store.add({"b": wall.now + 10})
    version, _ = store.probe()
    assert version.epoch != cursor.epoch
    assert plan_pull(cursor, version) is Pull.EVERYTHING


def test_concurrent_writers_lose_nothing(client: redis.Redis[str], prefix: str) -> None:
    wall = Wall()
    stores = [RevokeStore(client, prefix, max_entries=100_000, wall_clock=wall) for _ in range(4)]

    def write(n: int) -> None:
        for i in range(50):
            stores[n].add({f"w{n}-{i}": wall.now + 100, "shared": wall.now + 100})

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snapshot = stores[0].pull()
    assert len(snapshot.ids.kept) == 4 * 50 + 1
    assert snapshot.version.seq == 4 * 50 + 1  # "shared" changed once, not four times


def test_large_writes_are_chunked_and_malformed_contents_dropped(
    client: redis.Redis[str], prefix: str
) -> None:
    wall = Wall()
    store = RevokeStore(client, prefix, max_entries=100_000, wall_clock=wall)
    n = WRITE_CHUNK * 2 + 7
    assert store.add({f"id{i}": wall.now + 60 for i in range(n)}) == n
    client.zadd(store.keys[0], {"x" * 300: wall.now + 60})
    client.zadd(store.keys[1], {'["h"]': wall.now + 60, "{bad": wall.now + 60})
    snapshot = store.pull()
    assert len(snapshot.ids.kept) == n
    assert snapshot.ids.dropped == 1 and snapshot.stamps.dropped == 2
