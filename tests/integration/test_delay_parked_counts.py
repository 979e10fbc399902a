"""What the delay store holds per queue (issue 54's ``celery_extras_queue_parked``): counts
the store keeps as it parks and removes entries, checked on the in-memory reference and on
Redis (one Redis, and the private cluster) with exact figures through every path that
removes an entry: take, discard, purge (by queue, route and task name), withdraw, and the
claim's dropping of a broken entry. Read with one ``HGETALL`` per shard.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest

from celery_extras.delay.entry import Entry
from celery_extras.delay.redis_store import ParkNotReplicated, RedisDelayStore, delay_keys
from celery_extras.delay.store import DelayStore, Selection, TakeStatus
from tests.integration.test_delay_store import on_redis, store  # noqa: F401 - fixtures
from tests.unit.test_delay_core import make_entry, tokens


def entry_for(task_id: str, queue: str | None, routing_key: str = "", exchange: str = "x") -> Entry:
    return replace(make_entry(task_id), queue=queue, routing_key=routing_key, exchange=exchange)


def park_all(held: DelayStore) -> None:
    """7 entries for queue ``a``, 3 for ``b``, 2 recording no queue routed by ``rk`` (they
    count for their routing key) and 1 with neither (it counts for none)."""
    for i in range(7):
        assert held.park(f"a{i}", entry_for(f"ta{i}", "a"), 0.0)
    for i in range(3):
        assert held.park(f"b{i}", entry_for(f"tb{i}", "b", "b"), 3600.0)
    for i in range(2):
        assert held.park(f"r{i}", entry_for(f"tr{i}", None, "rk"), 0.0)
    assert held.park("n0", entry_for("tn0", None, ""), 0.0)


def test_counts_follow_every_park_and_removal(store: DelayStore) -> None:  # noqa: F811
    park_all(store)
    assert store.parked_by_queue() == {"a": 7, "b": 3, "rk": 2}
    assert store.park("a0", entry_for("ta0", "a"), 0.0) is False  # known: no second count
    assert store.parked_by_queue() == {"a": 7, "b": 3, "rk": 2}

    claimed = {c.entry_id: c for c in store.claim(0.0, 30.0, tokens(20)).items}
    assert sorted(claimed) == [*(f"a{i}" for i in range(7)), "n0", "r0", "r1"]
    assert store.parked_by_queue() == {"a": 7, "b": 3, "rk": 2}  # claimed: still held
    assert store.release_all([(i, c.token) for i, c in claimed.items()], 600.0) == 10
    assert store.parked_by_queue() == {"a": 7, "b": 3, "rk": 2}  # released: still held

    for i in (0, 1):
        assert store.take(f"a{i}", f"ta{i}", claimed[f"a{i}"].token).status is TakeStatus.TAKEN
        assert store.take(f"a{i}", f"ta{i}", claimed[f"a{i}"].token).status is (
            TakeStatus.REDELIVERED
        )
    assert store.take("a2", "ta2", "forged").status is TakeStatus.UNKNOWN
    assert store.parked_by_queue() == {"a": 5, "b": 3, "rk": 2}

    store.discard("b0")
    store.discard("b0")  # gone already: no second count
    store.discard("a0")  # a tombstone (taken): counted down at its take, not again
    store.discard("nothing")
    assert store.parked_by_queue() == {"a": 5, "b": 2, "rk": 2}

    assert store.purge(Selection(queues=frozenset({"a"}))).dropped == 5
    assert store.parked_by_queue() == {"b": 2, "rk": 2}  # a's count goes, not left at 0
    assert store.purge(Selection(queues=frozenset({"a"}))).dropped == 0
    assert store.take("a2", "ta2", claimed["a2"].token).status is TakeStatus.PURGED
    assert store.parked_by_queue() == {"b": 2, "rk": 2}

    assert store.purge(Selection(routes=frozenset({("x", "rk")}))).dropped == 2
    assert store.purge(Selection(tasks=frozenset({"tasks.add"}))).dropped == 3  # b1, b2, n0
    assert store.parked_by_queue() == {} and store.depth() == 0


def test_counts_of_a_sharded_store_are_one_read_per_shard(
    on_redis: tuple[Any, str],  # noqa: F811
) -> None:
    """200 entries over 4 shards: exact counts, read with one ``HGETALL`` per shard (the
    first shard, which earlier releases parked in, and the 4)."""
    client, prefix = on_redis
    counting = CountingClient(client)
    held = RedisDelayStore(counting, prefix, shards=4)  # type: ignore[arg-type]
    for i in range(200):
        assert held.park(f"e{i}", entry_for(f"t{i}", "ab"[i % 2]), 0.0)
    held.shards()  # the layouts read, once per 30 s
    counting.calls.clear()
    assert held.parked_by_queue() == {"a": 100, "b": 100}
    assert counting.calls == ["hgetall"] * 5
    claimed = held.claim(0.0, 30.0, tokens(300)).items
    for c in claimed[:150]:
        assert held.take(c.entry_id, "t" + c.entry_id[1:], c.token).status is TakeStatus.TAKEN
    left = [int(c.entry_id[1:]) % 2 for c in claimed[150:]]
    assert held.parked_by_queue() == {
        q: n for q, n in (("a", left.count(0)), ("b", left.count(1))) if n
    }


class CountingClient:
    """A store client that records the read commands the counts make."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: list[str] = []

    def hgetall(self, key: str) -> Any:
        self.calls.append("hgetall")
        return self.client.hgetall(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_withdrawn_park_counts_no_more(on_redis: tuple[Any, str]) -> None:  # noqa: F811
    client, prefix = on_redis
    waiting = RedisDelayStore(client, prefix, replicas=1, replica_wait=0.05)
    with pytest.raises(ParkNotReplicated):
        waiting.park("e1", entry_for("t1", "a"), 0.0)
    assert waiting.parked_by_queue() == {}
    assert client.hlen(delay_keys(prefix)["parked"]) == 0


def test_a_broken_entry_the_claim_drops_counts_no_more(
    on_redis: tuple[Any, str],  # noqa: F811
) -> None:
    client, prefix = on_redis
    held = RedisDelayStore(client, prefix)
    held.park("e1", entry_for("t1", "a"), 0.0)
    held.park("e2", entry_for("t2", "a"), 0.0)
    client.hdel(delay_keys(prefix)["msg"], "e1")  # its message lost (by hand)
    assert [c.entry_id for c in held.claim(0.0, 30.0, tokens(5)).items] == ["e2"]
    assert held.parked_by_queue() == {"a": 1} and held.depth() == 1


def test_a_count_that_is_no_count_is_read_as_none_and_logged_once(
    on_redis: tuple[Any, str],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Counts written by hand: a negative or a non-number is read as 0 (logged once), and
    the scripts that meet it reset it rather than fail: parks and takes go on."""
    client, prefix = on_redis
    parked = delay_keys(prefix)["parked"]
    held = RedisDelayStore(client, prefix)
    client.hset(parked, mapping={"a": "junk", "b": "-3", "c": "2"})
    with caplog.at_level(logging.WARNING, logger="celery_extras.delay.redis_store"):
        assert held.parked_by_queue() == {"c": 2}
        assert held.parked_by_queue() == {"c": 2}
    warned = [r.getMessage() for r in caplog.records if "not a count" in r.getMessage()]
    assert len(warned) == 2 and "'a'" in warned[0] + warned[1] and "'-3'" in " ".join(warned)
    assert held.park("e1", entry_for("t1", "a"), 0.0)
    assert held.park("e2", entry_for("t2", "b"), 0.0)
    assert held.parked_by_queue() == {"a": 1, "b": 1, "c": 2}
    (c1, c2) = sorted(held.claim(0.0, 30.0, tokens(2)).items, key=lambda c: c.entry_id)
    assert held.take("e1", "t1", c1.token).status is TakeStatus.TAKEN
    assert held.take("e2", "t2", c2.token).status is TakeStatus.TAKEN
    assert held.parked_by_queue() == {"c": 2}


def test_entries_parked_before_the_counts_are_not_counted_down(
    on_redis: tuple[Any, str],  # noqa: F811
) -> None:
    """An entry whose meta names no queue (parked by an earlier release) counts for none:
    taking or purging it leaves the others' counts alone."""
    client, prefix = on_redis
    held = RedisDelayStore(client, prefix)
    held.park("new", entry_for("t1", "a"), 0.0)
    held.park("old", entry_for("t2", "a"), 0.0)
    meta = delay_keys(prefix)["meta"]
    old = json.loads(client.hget(meta, "old"))
    assert old.pop("q") == "a"
    client.hset(meta, "old", json.dumps(old))
    client.hincrby(delay_keys(prefix)["parked"], "a", -1)  # as an earlier release parked it
    assert held.parked_by_queue() == {"a": 1}
    claimed = {c.entry_id: c for c in held.claim(0.0, 30.0, tokens(2)).items}
    assert held.take("old", "t2", claimed["old"].token).status is TakeStatus.TAKEN
    assert held.parked_by_queue() == {"a": 1}
    assert held.take("new", "t1", claimed["new"].token).status is TakeStatus.TAKEN
    assert held.parked_by_queue() == {}


def test_an_entry_an_older_release_took_is_counted_down_when_its_tombstone_goes(
    on_redis: tuple[Any, str],  # noqa: F811
) -> None:
    """A rolling upgrade: a worker of an earlier release takes an entry this release parked
    (and counted) and leaves its ``q``; pruning its tombstone counts it down, once."""
    client, prefix = on_redis
    keys = delay_keys(prefix)
    held = RedisDelayStore(client, prefix, tombstone_ttl=0.0)
    held.park("e1", entry_for("t1", "a"), 0.0)
    held.park("e2", entry_for("t2", "a"), 3600.0)
    meta = json.loads(client.hget(keys["meta"], "e1"))
    client.hset(keys["meta"], "e1", json.dumps({**meta, "c": ["tok0"], "x": "tok0"}))
    client.zrem(keys["due"], "e1")
    client.hdel(keys["msg"], "e1")
    client.zadd(keys["taken"], {"e1": 0})  # as the earlier take script leaves it
    assert held.parked_by_queue() == {"a": 2}
    assert held.claim(0.0, 30.0, tokens(1)).items == []  # prunes the tombstone
    assert held.parked_by_queue() == {"a": 1} and not client.hexists(keys["meta"], "e1")
    held.claim(0.0, 30.0, tokens(1))
    assert held.parked_by_queue() == {"a": 1}
