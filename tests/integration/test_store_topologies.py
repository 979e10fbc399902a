"""The store's Redis code on a Redis Cluster beside the single Redis: buckets, failure memory.

No worker here: the scripts and key layout straight against the servers. The
revoke store's own tests (``test_sync_store.py``) run on both as well; the
workers' suites on the cluster are marked in ``test_sync.py`` and
``test_policies.py``.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_extras.limits.redis_bucket import GlobalTokenBucket, Override
from celery_extras.retries.redis_failure_memory import RedisCounts
from celery_extras.store.client import connect
from celery_extras.sync.revoke_store import RevokeStore
from tests.support.clock import FakeClock
from tests.support.topology import RedisClusterTopology, redis_sentinel

#: Timing is asserted here (rates, latencies): under pytest-xdist these tests run alone.
pytestmark = pytest.mark.exclusive


@pytest.fixture
def prefix(client: Any) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    for key in client.scan_iter(f"{name}:*"):
        client.delete(key)


def test_bucket_books_burst_then_one_slot_per_interval(client: Any, prefix: str) -> None:
    bucket = GlobalTokenBucket(client, prefix)
    waits = [bucket.reserve("t", 10.0, 3) for _ in range(5)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3] == pytest.approx(0.1, abs=0.02)
    assert waits[4] == pytest.approx(0.2, abs=0.02)


def test_several_limits_of_a_task_share_one_slot_and_one_script(client: Any, prefix: str) -> None:
    """A task's buckets lie under its hash tag: on a cluster, one script books them all."""
    from celery_extras.limits.redis_bucket import LimitTake

    bucket = GlobalTokenBucket(client, prefix)
    takes = [LimitTake("t", "", 10.0, 1, 1), LimitTake("t#2", "a", 2.0, 1, 1, narrow=True),
             LimitTake("t#3", "b", 5.0, 1, 1, narrow=True)]  # fmt: skip
    first = bucket.acquire("t", takes, tagged=True)
    second = bucket.acquire("t", takes, tagged=True)
    assert (first.wait, first.booked) == (0.0, (True, True, True))
    assert second.wait == pytest.approx(0.5, abs=0.02) and second.binding == 1
    assert second.booked == (False, True, True)  # the narrow ones queue, the broad one waits
    keys = sorted(client.scan_iter(f"{prefix}:bucket:*"))
    assert keys == [f"{prefix}:bucket:{{t}}:t#2:a", f"{prefix}:bucket:{{t}}:t#3:b",
                    f"{prefix}:bucket:{{t}}:t:"]  # fmt: skip


def test_stored_override_applies_within_the_refresh(client: Any, prefix: str) -> None:
    mono = FakeClock()
    bucket = GlobalTokenBucket(client, prefix, clock=mono)
    other = GlobalTokenBucket(client, prefix)  # another worker, or the CLI
    assert bucket.reserve("t", 10.0, 1) == 0.0
    assert bucket.reserve("t", 10.0, 1) == pytest.approx(0.1, abs=0.02)
    other.set_override("t", Override(1.0, 1, "1/s"))
    # the first bucket still trusts what it read: 10/s
    assert bucket.reserve("t", 10.0, 1) == pytest.approx(0.2, abs=0.02)
    mono.now += 1.0  # the refresh passed: now 1/s, one second between slots
    assert bucket.reserve("t", 10.0, 1) == pytest.approx(0.3, abs=0.05)
    assert bucket.reserve("t", 10.0, 1) == pytest.approx(1.3, abs=0.05)


def test_a_lost_bucket_write_delays_and_never_frees_slots(client: Any, prefix: str) -> None:
    """A failover that drops the bucket (its last writes were not replicated) must not
    hand out the slots this worker already booked: the worker's floor keeps them booked."""
    bucket = GlobalTokenBucket(client, prefix)
    for _ in range(5):
        bucket.reserve("t", 10.0, 1)
    client.delete(bucket.bucket_key("t"))  # what the new master never received
    assert bucket.reserve("t", 10.0, 1) == pytest.approx(0.5, abs=0.05)
    fresh = GlobalTokenBucket(client, f"{prefix}x")  # nothing booked: no floor, no delay
    assert fresh.reserve("t", 10.0, 1) == 0.0


def test_per_key_buckets_are_independent_and_spread_over_the_masters(
    redis_cluster_topology: RedisClusterTopology, prefix: str
) -> None:
    client = redis_cluster_topology.client()
    bucket = GlobalTokenBucket(client, prefix)
    keys = [f"customer-{n}" for n in range(12)]
    assert [bucket.reserve("t", 1.0, 1, key) for key in keys] == [0.0] * 12
    assert all(bucket.reserve("t", 1.0, 1, key) > 0.9 for key in keys)
    nodes = {client.get_node_from_key(bucket.bucket_key("t", key)).port for key in keys}
    assert nodes == set(redis_cluster_topology.ports)


def test_failure_counts_on_either_store(client: Any, prefix: str) -> None:
    counts = RedisCounts(client, f"{prefix}:fail:t", ttl=60)
    assert [counts.incr("item") for _ in range(3)] == [1, 2, 3]
    assert counts.get("item") == 3 and counts.get("other") == 0
    assert 0 < client.pttl(counts.key("item")) <= 60_000
    counts.forget("item")
    assert counts.get("item") == 0


def test_bucket_time_is_the_servers(client: Any, prefix: str) -> None:
    """Slots are booked on the Redis server's clock, so every master of a cluster agrees
    with a host whose clock is off (here: loopback, so the same clock)."""
    bucket = GlobalTokenBucket(client, prefix)
    bucket.reserve("t", 1.0, 1)
    stored = int(client.get(bucket.bucket_key("t")))
    assert abs(stored / 1e6 - time.time()) < 2.0


def _move_slot(topology: RedisClusterTopology, slot: int, src: int, dst: int, between: Any) -> None:
    """Migrate *slot* from the master on port *src* to the one on *dst*, as resharding does,
    calling *between()* while the keys are on *dst* but the slot not yet handed over (ASK)."""
    nodes = {p: redis.Redis(port=p, decode_responses=True) for p in topology.ports}
    ids = {p: nodes[p].execute_command("CLUSTER", "MYID") for p in topology.ports}
    nodes[dst].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
    nodes[src].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
    keys = nodes[src].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    nodes[src].execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys)
    between()
    for port in topology.ports:
        nodes[port].execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dst])


def test_calls_follow_a_slot_moved_to_another_master(
    redis_cluster_topology: RedisClusterTopology,
) -> None:
    """Resharding under a running bucket: the client follows ASK while the slot migrates
    and MOVED after, and the bucket's state moves with its key (no slot handed out twice)."""
    client = connect(redis_cluster_topology.url, {})
    bucket = GlobalTokenBucket(client, f"t{uuid.uuid4().hex[:10]}")
    key = bucket.bucket_key("t")
    bucket.reserve("warm-up", 10.0, 1)  # the client's slot map and the script, loaded
    slots: list[float] = []

    def book() -> None:
        slots.append(time.monotonic() + bucket.reserve("t", 10.0, 1))

    for _ in range(3):
        book()
    slot = int(client.keyslot(key))
    src = int(client.get_node_from_key(key).port)
    dst = next(p for p in redis_cluster_topology.ports if p != src)
    _move_slot(
        redis_cluster_topology, slot, src, dst,
        between=book,  # ASK: the key is on the new master, the slot not yet handed over
    )  # fmt: skip
    book()  # MOVED: the client learns the new owner
    assert int(client.get_node_from_key(key).port) == dst
    # one slot per 0.1 s, on either side of the move: the bucket moved with its key
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert all(0.08 <= gap <= 0.12 for gap in gaps), gaps
    client.delete(key)


def test_sentinel_client_goes_to_the_new_master_after_a_failover(tmp_path: Path) -> None:
    """The first call after the promotion succeeds: the pooled connection to the dead master
    fails, the client asks the Sentinels again and retries once on the new master. The
    bucket replicated before the kill carries on; revokes written before it are there."""
    with redis_sentinel(tmp_path) as sentinel:
        client = connect(sentinel.url, sentinel.options)
        bucket = GlobalTokenBucket(client, "t")
        revokes = RevokeStore(client, "t", max_entries=100)
        revokes.add({"before": time.time() + 60})
        slots = [time.monotonic() + bucket.reserve("t", 10.0, 1) for _ in range(3)]
        client.execute_command("WAIT", 1, 1000)  # replicated, as it would be within ms
        old = sentinel.kill_master()
        sentinel.wait_failover(old)
        slots.append(time.monotonic() + bucket.reserve("t", 10.0, 1))
        assert client.connection_pool.get_master_address()[1] != old
        assert slots[3] - slots[2] >= 0.09  # no slot handed out twice across the failover
        assert "before" in revokes.pull().ids.kept
