"""The Redis delay store's scripts against the rules of the in-memory reference.

Every step is checked on both stores, with times chosen so that no clock needs
to move (delays of 0 or far in the future, leases and re-checks of 0).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_extras.delay.memory_store import MemoryDelayStore
from celery_extras.delay.redis_store import ParkNotReplicated, RedisDelayStore, delay_keys
from celery_extras.delay.store import DelayStore, Take
from celery_extras.store.client import connect
from tests.support.brokers import REDIS_URL, require_broker
from tests.support.topology import RedisClusterTopology
from tests.unit.test_delay_core import make_entry, tokens


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[DelayStore]:
    if request.param == "memory":
        yield MemoryDelayStore()
        return
    client: Any
    if request.param == "redis-cluster":  # the private 3-master cluster, through the store's client
        topology: RedisClusterTopology = request.getfixturevalue("redis_cluster_topology")
        client = connect(topology.url, {})
    else:
        require_broker("redis")
        client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield RedisDelayStore(client, prefix, tombstone_ttl=3600.0)
    client.delete(*delay_keys(prefix).values())


@pytest.fixture(params=["redis", "redis-cluster"])
def unreplicated(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    """A store client on a Redis without replicas (the shared one, the private cluster's
    masters) and a fresh prefix."""
    client: Any
    if request.param == "redis-cluster":
        topology: RedisClusterTopology = request.getfixturevalue("redis_cluster_topology")
        client = connect(topology.url, {})
    else:
        require_broker("redis")
        client = connect(REDIS_URL, {})
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield client, prefix
    client.delete(*delay_keys(prefix).values())


def test_keys_share_one_hash_tag() -> None:
    keys = delay_keys("celery-extras")
    assert {k.split("}")[0] + "}" for k in keys.values()} == {"{celery-extras:delay}"}


def test_park_claim_release_take(store: DelayStore) -> None:
    assert store.park("e1", make_entry("t1"), 0.0) is True
    assert store.park("e1", make_entry("t1"), 0.0) is False
    assert store.park("e2", make_entry("t2"), 3600.0) is True
    assert store.depth() == 2
    claimed = store.claim(0.5, 30.0, tokens(10))
    assert [(c.entry_id, c.token, c.attempt) for c in claimed.items] == [("e1", "tok0", 1)]
    assert claimed.items[0].raw == make_entry("t1").dumps()
    assert -0.1 < claimed.items[0].due_in <= 0.0
    assert claimed.next_in is not None and 25 < claimed.next_in <= 30.0  # e1's lease
    assert store.claim(0.5, 30.0, tokens(10, 1)).items == []  # leased
    assert store.release("e1", "tok0", 0.0) is True
    (again,) = store.claim(0.5, 30.0, tokens(1, 5)).items  # re-check 0: published again
    assert (again.token, again.attempt) == ("tok5", 2)
    assert store.take("e1", "t1", "forged").status is Take.UNKNOWN
    assert store.take("e1", "t2", "tok5").status is Take.UNKNOWN
    assert store.take("zz", "t1", "tok5").status is Take.UNKNOWN
    taken = store.take("e1", "t1", "tok5")
    assert taken.status is Take.TAKEN and taken.kind == "limit"
    assert store.take("e1", "t1", "tok0").status is Take.DUPLICATE
    assert store.take("e1", "t1", "tok5").status is Take.REDELIVERED
    assert store.release("e1", "tok5", 0.0) is False
    assert store.depth() == 1
    assert store.claim(0.5, 0.0, tokens(5, 10)).items == []
    assert store.park("e1", make_entry("t1"), 0.0) is False  # the tombstone remembers it
    summary = store.summary()
    assert list(summary) == ["tasks.add"] and summary["tasks.add"].parked == 1
    next_in = summary["tasks.add"].next_in
    assert next_in is not None and 3590 < next_in <= 3600


def test_expired_lease_is_claimed_again(store: DelayStore) -> None:
    store.park("e1", make_entry("t1"), 0.0)
    (first,) = store.claim(0.0, 0.0, tokens(1)).items  # lease 0: ends at once
    (second,) = store.claim(0.0, 0.0, tokens(1, 1)).items
    assert (first.attempt, second.attempt) == (1, 2)
    assert store.take("e1", "t1", first.token).status is Take.TAKEN
    assert store.take("e1", "t1", second.token).status is Take.DUPLICATE


def test_invalid_entries_are_dropped_by_discard(store: DelayStore) -> None:
    store.park("e1", make_entry("t1"), 0.0)
    store.discard("e1")
    assert store.depth() == 0 and store.claim(0.0, 1.0, tokens(1)).items == []


def test_garbage_in_the_store_is_dropped_not_fatal() -> None:
    require_broker("redis")
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    keys = delay_keys(prefix)
    try:
        store = RedisDelayStore(client, prefix)
        client.zadd(keys["due"], {"junk": 0, "nometa": 0})
        client.hset(keys["meta"], "junk", "{not json")
        store.park("e1", make_entry("t1"), 0.0)
        claimed = store.claim(0.0, 5.0, tokens(5))
        assert [c.entry_id for c in claimed.items] == ["e1"]
        assert client.zrange(keys["due"], 0, -1) == ["e1"]
        assert store.take("junk", "t1", "tok0").status is Take.UNKNOWN
    finally:
        client.delete(*keys.values())


def test_a_park_no_replica_acknowledges_is_withdrawn_then_parks_anew(
    unreplicated: tuple[Any, str],
) -> None:
    """``WAIT 1`` on a master without replicas: the park fails and leaves nothing behind (no
    tombstone), so the same message parked later is stored anew, not taken as known."""
    client, prefix = unreplicated
    waiting = RedisDelayStore(client, prefix, replicas=1, replica_wait=0.05)
    plain = RedisDelayStore(client, prefix)
    with pytest.raises(ParkNotReplicated, match="0 of 1 replica"):
        waiting.park("e1", make_entry("t1"), 0.0)
    assert plain.depth() == 0 and client.hlen(plain.keys["meta"]) == 0
    assert client.hlen(plain.keys["msg"]) == 0
    assert plain.park("e1", make_entry("t1"), 0.0) is True
    assert RedisDelayStore(client, prefix, replicas=0).park("e1", make_entry("t1"), 0.0) is False


def test_a_park_claimed_or_taken_before_its_withdrawal_stands(
    unreplicated: tuple[Any, str],
) -> None:
    """A mover claimed the entry (a copy may be out) or a worker took it before the park's
    WAIT ended: withdrawing it would let the original run beside that copy."""
    client, prefix = unreplicated
    plain = RedisDelayStore(client, prefix)
    waiting = RedisDelayStore(client, prefix, replicas=1, replica_wait=0.05)
    plain.park("e1", make_entry("t1"), 0.0)
    (claim,) = plain.claim(0.0, 30.0, tokens(1)).items
    assert waiting.park("e1", make_entry("t1"), 0.0) is False  # known: it stands
    assert plain.take("e1", "t1", claim.token).status is Take.TAKEN
    assert waiting.park("e1", make_entry("t1"), 0.0) is False
    assert plain.take("e1", "t1", claim.token).status is Take.REDELIVERED
