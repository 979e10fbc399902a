"""The durable revoke store against a real Redis: atomic, idempotent, bounded, self-trimming.

No worker and no broker here (the store is Redis whatever the broker), so these
tests are not parametrized over brokers but over the store: the shared single Redis
and a private 3-master Redis Cluster. A fake wall clock drives expiry.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_extras.sync.digest import Pull, plan_pull
from celery_extras.sync.revoke_store import (
    PULL_PAGE,
    SHARDS,
    WRITE_CHUNK,
    RevokeStore,
    shard_of,
)
from tests.support.clock import FakeClock
from tests.support.revokes import write_raw_entry
from tests.support.topology import RedisClusterTopology

WALL = 1_800_000_000.0


@pytest.fixture
def prefix(client: Any) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    for pattern in (f"{name}:*", f"{{{name}:*"):
        for key in client.scan_iter(pattern):
            client.delete(key)


def shard_key(store: RevokeStore, member: str, part: int) -> str:
    return store.shard_keys[shard_of(member)][part]


def test_writes_are_idempotent_and_pulls_return_only_the_changes(client: Any, prefix: str) -> None:
    wall = FakeClock(WALL)
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
    changes = store.pull(cursor)
    assert changes.ids.kept == {"a": wall.now + 50, "c": wall.now + 50}
    assert changes.stamps.kept == {}
    assert plan_pull(changes.version, store.probe()[0]) is Pull.NOTHING


def test_store_trims_expired_entries_and_evicts_beyond_its_bound(client: Any, prefix: str) -> None:
    wall = FakeClock(WALL)
    # each shard keeps its share of the bound: 3 per shard here
    store = RevokeStore(client, prefix, max_entries=3 * SHARDS, wall_clock=wall)
    same_shard = [i for i in (f"id{n}" for n in range(200)) if shard_of(i) == 0][:5]
    store.add({task_id: wall.now + 10 + n for n, task_id in enumerate(same_shard)})
    assert store.counts()["ids"] == 3
    assert set(store.pull().ids.kept) == set(same_shard[2:])  # soonest-expiring evicted
    wall.now += 12.5
    store.probe()
    assert store.counts()["ids"] == 2  # the third expired and was trimmed
    assert client.zcard(shard_key(store, same_shard[0], 2)) == 2  # its change-log entry too
    wall.now += 100
    assert store.add({"late": wall.now + 1}) == 1
    assert store.counts()["ids"] == 1


def test_clock_is_the_highest_reported(client: Any, prefix: str) -> None:
    store = RevokeStore(client, prefix, max_entries=10)
    assert store.probe(clock=41)[1] == 41
    assert store.probe(clock=7)[1] == 41
    assert store.pull(clock=99).clock == 99


def test_emptied_store_gets_a_new_epoch_and_a_full_pull(client: Any, prefix: str) -> None:
    wall = FakeClock(WALL)
    store = RevokeStore(client, prefix, max_entries=10, wall_clock=wall)
    store.add({"a": wall.now + 10})
    cursor = store.pull().version
    for keys in store.shard_keys:
        for key in keys:
            client.delete(key)
    store.add({"b": wall.now + 10})
    version, _ = store.probe()
    assert version.epoch != cursor.epoch
    assert plan_pull(cursor, version) is Pull.EVERYTHING


def test_concurrent_writers_lose_nothing(client: Any, prefix: str) -> None:
    wall = FakeClock(WALL)
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


def test_pulls_come_a_page_at_a_time_and_miss_no_change_made_between_pages(
    client: Any, prefix: str
) -> None:
    wall = FakeClock(WALL)
    store = RevokeStore(client, prefix, max_entries=100_000, wall_clock=wall)
    ids = [f"p{i}" for i in range(20_000)]  # about 2,500 a shard: two pages each
    store.add({task_id: wall.now + 60 for task_id in ids})
    pages = store.pages(0)
    first = next(pages)
    assert len(first.ids.kept) == PULL_PAGE
    # between two pages an entry already read changes, and a new one comes
    reread = next(iter(first.ids.kept))
    fresh = next(f"n{i}" for i in range(1000) if shard_of(f"n{i}") == 0)
    store.add({reread: wall.now + 90, fresh: wall.now + 90})
    rest = list(pages)
    read = dict(first.ids.kept)
    for page in rest:
        assert 0 < len(page.ids.kept) <= PULL_PAGE
        read.update(page.ids.kept)
    assert set(read) == {i for i in ids if shard_of(i) == 0} | {fresh}
    assert read[reread] == wall.now + 90
    assert rest[-1].version == store.probe()[0].shards[0]  # the cursor to read on from


def test_garbage_in_a_counter_starts_a_new_epoch_with_every_entry_logged_again(
    client: Any, prefix: str
) -> None:
    wall = FakeClock(WALL)
    store = RevokeStore(client, prefix, max_entries=100_000, wall_clock=wall)
    ids = {f"g{i}": wall.now + 60 for i in range(3000)}
    store.add(ids, {("h", "v"): wall.now + 60})
    before = store.probe()[0]
    for keys in store.shard_keys:
        client.set(keys[3], "abc")
    version, _ = store.probe()
    assert plan_pull(before, version) is Pull.EVERYTHING
    assert version.seq == len(ids) + 1  # every entry has a change again
    everything = store.pull()
    assert everything.ids.kept == ids and set(everything.stamps.kept) == {("h", "v")}


def test_large_writes_are_chunked_and_malformed_contents_dropped(client: Any, prefix: str) -> None:
    wall = FakeClock(WALL)
    store = RevokeStore(client, prefix, max_entries=100_000, wall_clock=wall)
    n = WRITE_CHUNK * 2 + 7
    assert store.add({f"id{i}": wall.now + 60 for i in range(n)}) == n
    write_raw_entry(store, 3, "x" * 300, wall.now + 60)
    write_raw_entry(store, 5, '["h"]', wall.now + 60, stamp=True)
    write_raw_entry(store, 5, "{bad", wall.now + 60, stamp=True)
    snapshot = store.pull()
    assert len(snapshot.ids.kept) == n
    assert snapshot.ids.dropped == 1 and snapshot.stamps.dropped == 2


def test_shards_spread_over_every_master_of_a_cluster(
    redis_cluster_topology: RedisClusterTopology, prefix: str
) -> None:
    client = redis_cluster_topology.client()
    store = RevokeStore(client, prefix, max_entries=1000)
    ids = {f"id{n}": time.time() + 60 for n in range(400)}
    store.add(ids)
    slots = {client.keyslot(keys[0]) for keys in store.shard_keys}
    nodes = {client.get_node_from_key(keys[0]).port for keys in store.shard_keys}
    assert len(slots) == SHARDS and nodes == set(redis_cluster_topology.ports)
    assert all(client.zcard(keys[0]) > 0 for keys in store.shard_keys)
    assert set(store.pull().ids.kept) == set(ids)


def test_revokes_written_in_the_previous_layout_are_read(client: Any, prefix: str) -> None:
    """The previous version kept one unsharded set under <prefix>:sync:; a worker of this
    version loads what it wrote (ids, stamps, clock), with their expiries."""
    wall = FakeClock(WALL)
    client.zadd(f"{prefix}:sync:revoked", {"old-a": wall.now + 30, "old-gone": wall.now - 1})
    client.zadd(f"{prefix}:sync:stamps", {'["h","v"]': wall.now + 40})
    client.set(f"{prefix}:sync:clock", 77)
    store = RevokeStore(client, prefix, max_entries=100, wall_clock=wall)
    store.add({"new": wall.now + 50})
    snapshot = store.pull()
    assert snapshot.ids.kept == {"old-a": wall.now + 30, "new": wall.now + 50}
    assert snapshot.stamps.kept == {("h", "v"): wall.now + 40}
    assert snapshot.clock == 77
    assert store.pull(snapshot.version).ids.kept == {}  # only full loads read the old keys
