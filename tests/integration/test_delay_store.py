"""The Redis delay store's scripts against the rules of the in-memory reference.

Every step is checked on both stores, with times chosen so that no clock needs
to move (delays of 0 or far in the future, leases and re-checks of 0).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from celery_extras.delay.entry import Entry
from celery_extras.delay.memory_store import MemoryDelayStore
from celery_extras.delay.redis_store import ParkNotReplicated, RedisDelayStore, delay_keys
from celery_extras.delay.shards import first_shard, layout
from celery_extras.delay.store import DelayStore, Purged, Selection, TakeStatus
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
def on_redis(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    """A store client on a Redis without replicas (the shared one, the private cluster's
    masters) and a fresh prefix; every key of the prefix, in any shard, deleted after."""
    client: Any
    if request.param == "redis-cluster":
        topology: RedisClusterTopology = request.getfixturevalue("redis_cluster_topology")
        client = connect(topology.url, {})
    else:
        require_broker("redis")
        client = connect(REDIS_URL, {})
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield client, prefix
    for count in (1, 3, 4):
        for shard in layout(prefix, count):
            client.delete(*shard.keys.values())
    client.delete(first_shard(prefix).key("layouts"))


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
    assert store.take("e1", "t1", "forged").status is TakeStatus.UNKNOWN
    assert store.take("e1", "t2", "tok5").status is TakeStatus.UNKNOWN
    assert store.take("zz", "t1", "tok5").status is TakeStatus.UNKNOWN
    taken = store.take("e1", "t1", "tok5")
    assert taken.status is TakeStatus.TAKEN and taken.kind == "limit"
    assert store.take("e1", "t1", "tok0").status is TakeStatus.DUPLICATE
    assert store.take("e1", "t1", "tok5").status is TakeStatus.REDELIVERED
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
    assert store.take("e1", "t1", first.token).status is TakeStatus.TAKEN
    assert store.take("e1", "t1", second.token).status is TakeStatus.DUPLICATE


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
        assert store.take("junk", "t1", "tok0").status is TakeStatus.UNKNOWN
    finally:
        client.delete(*keys.values())


def test_a_park_no_replica_acknowledges_is_withdrawn_then_parks_anew(
    on_redis: tuple[Any, str],
) -> None:
    """``WAIT 1`` on a master without replicas: the park fails and leaves nothing behind (no
    tombstone), so the same message parked later is stored anew, not taken as known."""
    client, prefix = on_redis
    waiting = RedisDelayStore(client, prefix, replicas=1, replica_wait=0.05)
    plain = RedisDelayStore(client, prefix)
    with pytest.raises(ParkNotReplicated, match="0 of 1 replica"):
        waiting.park("e1", make_entry("t1"), 0.0)
    assert plain.depth() == 0 and client.hlen(delay_keys(prefix)["meta"]) == 0
    assert client.hlen(delay_keys(prefix)["msg"]) == 0
    assert plain.park("e1", make_entry("t1"), 0.0) is True
    assert RedisDelayStore(client, prefix, replicas=0).park("e1", make_entry("t1"), 0.0) is False


def test_a_park_claimed_or_taken_before_its_withdrawal_stands(
    on_redis: tuple[Any, str],
) -> None:
    """A mover claimed the entry (a copy may be out) or a worker took it before the park's
    WAIT ended: withdrawing it would let the original run beside that copy."""
    client, prefix = on_redis
    plain = RedisDelayStore(client, prefix)
    waiting = RedisDelayStore(client, prefix, replicas=1, replica_wait=0.05)
    plain.park("e1", make_entry("t1"), 0.0)
    (claim,) = plain.claim(0.0, 30.0, tokens(1)).items
    assert waiting.park("e1", make_entry("t1"), 0.0) is False  # known: it stands
    assert plain.take("e1", "t1", claim.token).status is TakeStatus.TAKEN
    assert waiting.park("e1", make_entry("t1"), 0.0) is False
    assert plain.take("e1", "t1", claim.token).status is TakeStatus.REDELIVERED


# -- shards ----------------------------------------------------------------------------------


def test_a_sharded_store_spreads_entries_and_runs_each_once(on_redis: tuple[Any, str]) -> None:
    client, prefix = on_redis
    store = RedisDelayStore(client, prefix, shards=4)
    for i in range(200):
        assert store.park(f"e{i}", make_entry(f"t{i}"), 0.0) is True
    depths = store.shard_depths()
    assert sum(depths.values()) == store.depth() == 200
    assert depths["0"] == 0 and all(depths[f"4.{i}"] > 20 for i in range(4)), depths
    claimed = store.claim(0.0, 30.0, tokens(300)).items
    assert sorted(c.entry_id for c in claimed) == sorted(f"e{i}" for i in range(200))
    assert {c.token.partition("/")[0] for c in claimed} == {"4.0", "4.1", "4.2", "4.3"}
    assert store.claim(0.0, 30.0, tokens(300, 300)).items == []  # leased, in every shard
    assert store.release_all([(c.entry_id, c.token) for c in claimed], 600.0) == 200
    for c in claimed:
        assert store.take(c.entry_id, f"t{c.entry_id[1:]}", c.token).status is TakeStatus.TAKEN
        assert (
            store.take(c.entry_id, f"t{c.entry_id[1:]}", c.token).status is TakeStatus.REDELIVERED
        )
    assert store.depth() == 0
    assert store.take("e1", "t1", "9.9/tok").status is TakeStatus.UNKNOWN  # no such shard
    assert store.take("e1", "t1", "4.7/tok").status is TakeStatus.UNKNOWN


def test_entries_of_another_shard_count_are_released_across_the_change(
    on_redis: tuple[Any, str],
) -> None:
    """An upgrade (1 shard, the store of earlier releases, to 4) and a change back (4 to 1):
    what the former layout holds is claimed and taken, and a message released under it
    (its token naming its shard, or none) is taken by a store of the new layout."""
    client, prefix = on_redis
    one, four = RedisDelayStore(client, prefix), RedisDelayStore(client, prefix, shards=4)
    one.park("old", make_entry("t-old"), 0.0)
    (in_flight,) = one.claim(0.0, 30.0, ["legacy"]).items  # published before the upgrade
    assert in_flight.token == "legacy"  # the first shard's tokens name no shard
    one.park("old2", make_entry("t-old2"), 0.0)
    four.park("new", make_entry("t-new"), 0.0)  # registers the 4 shards
    assert four.take("old", "t-old", in_flight.token).status is TakeStatus.TAKEN
    claimed = {c.entry_id: c for c in four.claim(0.0, 30.0, tokens(5)).items}
    assert sorted(claimed) == ["new", "old2"]
    assert four.take("old2", "t-old2", claimed["old2"].token).status is TakeStatus.TAKEN
    # back to one shard: a worker of the old setting finds the 4 shards registered
    four.park("new2", make_entry("t-new2"), 0.0)
    back = RedisDelayStore(client, prefix)
    assert back.depth() == 2
    (again,) = back.claim(0.0, 30.0, tokens(5, 5)).items
    assert again.entry_id == "new2" and again.token.startswith("4.")
    assert back.take("new", "t-new", claimed["new"].token).status is TakeStatus.TAKEN
    assert back.take("new2", "t-new2", again.token).status is TakeStatus.TAKEN
    assert back.depth() == four.depth() == 0


def test_shards_spread_evenly_over_the_masters_of_a_cluster(
    redis_cluster_topology: RedisClusterTopology,
) -> None:
    """Each shard's hash tag falls in its own slice of the slots: 3 shards on a 3-master
    cluster, one per master; 12 shards, four per master."""
    client = connect(redis_cluster_topology.url, {})
    for count in (3, 12):
        masters = Counter(
            client.get_node_from_key(shard.key("due")).port for shard in layout("p", count)
        )
        assert len(masters) == 3 and set(masters.values()) == {count // 3}, masters


# -- herds -----------------------------------------------------------------------------------


def test_a_herd_is_claimed_ahead_of_its_time_at_the_workers_pace(store: DelayStore) -> None:
    """ETA and retry entries are claimed within the lookahead when more are due up to their
    time than workers take at the pace meanwhile: a sparse stream is not; a herd is, with
    the stream behind it, but not a limited task's entry; and no more while as many as the
    window wait to be taken."""
    for i in range(10):  # a stream, one every 10 s
        store.park(f"s{i}", make_entry(f"ts{i}", kind="eta"), 105.0 + 10 * i)
    assert store.claim(1.0, 30.0, tokens(100), 200.0, 10, 0.1).items == []  # i+1 in 105+10i s
    for i in range(50):
        store.park(f"h{i}", make_entry(f"t{i}", kind="eta" if i % 2 else "retry"), 100.0)
    store.park("slot", make_entry("t-slot", kind="limit"), 100.0)
    assert store.claim(1.0, 30.0, tokens(100), 200.0, 10, 1.0).items == []  # 51 in 100 s: 1/s
    assert store.claim(1.0, 30.0, tokens(100), 0.0, 10, 0.1).items == []  # no lookahead
    herd = store.claim(1.0, 30.0, tokens(100), 200.0, 10, 0.1).items  # 51 in 100 s: 0.1/s
    expected = [f"h{i}" for i in range(50)] + [f"s{i}" for i in range(10)]
    assert sorted(c.entry_id for c in herd) == sorted(expected)
    assert all(99.0 < c.due_in <= 100.0 for c in herd if c.entry_id.startswith("h"))
    assert store.release_all([(c.entry_id, c.token) for c in herd], 600.0) == 60
    for i in range(10):
        store.park(f"late{i}", make_entry(f"tl{i}", kind="eta"), 100.0)
    assert store.claim(1.0, 30.0, tokens(100, 200), 200.0, 10, 0.1).items == []  # 60 in flight
    for c in herd[:55]:
        task_id = ("t" if c.entry_id[0] == "h" else "ts") + c.entry_id[1:]
        assert store.take(c.entry_id, task_id, c.token).status is TakeStatus.TAKEN
    late = store.claim(1.0, 30.0, tokens(100, 300), 200.0, 10, 0.1).items  # 5 in flight
    assert sorted(c.entry_id for c in late) == sorted(f"late{i}" for i in range(10))


def test_hurry_finds_an_entry_in_any_shard(on_redis: tuple[Any, str]) -> None:
    """A parked entry made due now, whichever shard holds it (this layout's, or another's);
    one on its way stays as it is; an unknown one is reported so."""
    client, prefix = on_redis
    one, four = RedisDelayStore(client, prefix), RedisDelayStore(client, prefix, shards=4)
    one.park("old", make_entry("t-old"), 3600.0)
    four.park("new", make_entry("t-new"), 3600.0)
    assert four.claim(0.0, 30.0, tokens(5)).items == []
    assert four.hurry("old") is True and four.hurry("new") is True
    assert sorted(c.entry_id for c in four.claim(0.0, 30.0, tokens(5)).items) == ["new", "old"]
    assert four.hurry("new") is False  # claimed: on its way
    assert four.hurry("missing") is False


# -- purge -----------------------------------------------------------------------------------


def routed(task_id: str, queue: str | None, exchange: str = "q", routing_key: str = "q") -> Entry:
    """A parked message of *queue* (``None``: its worker consumed no queue its route names)."""
    return replace(make_entry(task_id), queue=queue, exchange=exchange, routing_key=routing_key)


def test_purge_drops_a_queues_entries_in_every_state_but_taken(store: DelayStore) -> None:
    """Parked, claimed (a mover publishing it) and released (its copy in a due queue) are
    dropped, and so is an entry recording no queue whose route the selection names; a taken
    one is the worker's (as Celery's purge leaves reserved messages), another queue's and an
    entry whose route is not named stay. Copies on their way are ``PURGED`` where taken."""
    store.park("parked", routed("t-parked", "a"), 3600.0)
    store.park("claimed", routed("t-claimed", "a"), 0.0)
    store.park("released", routed("t-released", "a"), 0.0)
    store.park("taken", routed("t-taken", "a"), 0.0)
    store.park("other", routed("t-other", "b"), 3600.0)
    store.park("route", routed("t-route", None, "x", "k"), 3600.0)
    store.park("unsure", routed("t-unsure", None, "topic", "k.1"), 3600.0)
    claims = {c.entry_id: c for c in store.claim(0.5, 30.0, tokens(5)).items}
    assert sorted(claims) == ["claimed", "released", "taken"]
    assert store.release("released", claims["released"].token, 600.0) is True
    assert store.take("taken", "t-taken", claims["taken"].token).status is TakeStatus.TAKEN

    selection = Selection(queues=frozenset({"a"}), routes=frozenset({("x", "k")}))
    assert store.purge(selection) == Purged(parked=2, on_their_way=2, kept=1)
    assert store.depth() == 2 and sorted(store.summary()) == ["tasks.add"]
    assert store.summary()["tasks.add"].parked == 2
    for eid in ("claimed", "released"):  # a copy out there, or published by a late mover
        assert store.take(eid, f"t-{eid}", claims[eid].token).status is TakeStatus.PURGED
        assert store.take(eid, f"t-{eid}", "forged").status is TakeStatus.UNKNOWN
    assert store.release("claimed", claims["claimed"].token, 600.0) is False  # the late mover
    assert store.take("taken", "t-taken", claims["taken"].token).status is TakeStatus.REDELIVERED
    assert store.park("parked", routed("t-parked", "a"), 0.0) is False  # delivered again: known
    assert store.hurry("parked") is False
    later = store.claim(7200.0, 30.0, tokens(9, 10)).items
    assert sorted(c.entry_id for c in later) == ["other", "unsure"]
    assert store.purge(selection) == Purged(kept=1)  # nothing more of "a"
    assert store.depth() == 2


def test_purge_by_task_name_drops_a_tasks_entries_whatever_their_queue(
    store: DelayStore,
) -> None:
    store.park("a1", routed("t1", "a"), 3600.0)
    store.park("b1", routed("t2", "b"), 0.0)
    store.park("n1", routed("t3", None, "topic", "k"), 3600.0)
    store.park("keep", replace(routed("t4", "a"), task="tasks.other", headers={}), 3600.0)
    (claim,) = store.claim(0.5, 30.0, tokens(1)).items
    dropped = store.purge(Selection(tasks=frozenset({"tasks.add"})))
    assert dropped == Purged(parked=2, on_their_way=1) and dropped.dropped == 3
    assert store.take("b1", "t2", claim.token).status is TakeStatus.PURGED
    assert list(store.summary()) == ["tasks.other"] and store.depth() == 1
    assert store.purge(Selection(tasks=frozenset({"tasks.none"}))) == Purged()


def test_purge_reaches_every_shard_and_layout_a_page_at_a_time(
    on_redis: tuple[Any, str],
) -> None:
    """Entries of the first shard (earlier releases), of 4 shards and of 3, purged by a store
    of one shard: every layout registered is read, each shard in pages of 7 entries."""
    client, prefix = on_redis
    one, three, four = (RedisDelayStore(client, prefix, shards=n) for n in (1, 3, 4))
    for i in range(150):
        parker = (one, three, four)[i % 3]
        assert parker.park(f"e{i}", routed(f"t{i}", "a" if i % 5 else "b"), 3600.0) is True
    assert sum(four.shard_depths().values()) == 150 and len(four.shard_depths()) == 8
    purger = RedisDelayStore(client, prefix)
    calls = 0
    script = purger._purge

    def counted(keys: list[str], args: list[Any]) -> Any:
        nonlocal calls
        calls += 1
        return script(keys, args)

    purger._purge = counted  # type: ignore[assignment]
    assert purger.purge(Selection(queues=frozenset({"a"})), page=7) == Purged(parked=120)
    assert calls > 8  # every shard, and more than one page in some
    assert one.depth() == 30 and set(one.summary()) == {"tasks.add"}
    assert purger.purge(Selection(queues=frozenset({"b"})), page=1000) == Purged(parked=30)
    assert one.depth() == 0 and all(d == 0 for d in four.shard_depths().values())


def test_purge_reads_entries_of_earlier_releases_and_leaves_garbage(
    on_redis: tuple[Any, str],
) -> None:
    """An entry in version 1 (names spelt out) is read by its queue or route; one whose
    message is not JSON is left to the mover (which discards it) and counted nowhere."""
    client, prefix = on_redis
    store = RedisDelayStore(client, prefix)
    msg = delay_keys(prefix)["msg"]
    for eid, queue, route in (("v1", "a", "q"), ("v1-route", None, "k"), ("junk", "a", "q")):
        store.park(eid, routed(f"t-{eid}", queue, "x", route), 3600.0)
        version_1 = {"v": 1, "task": "tasks.add", "id": f"t-{eid}", "kind": "eta",
                     "body": "[[1], {}, {}]", "body_encoding": "utf-8",
                     "content_type": "application/json", "content_encoding": "utf-8",
                     "headers": {}, "properties": {}, "exchange": "x", "routing_key": route,
                     "queue": queue}  # fmt: skip
        client.hset(msg, eid, json.dumps(version_1) if eid != "junk" else "{not json")
    selection = Selection(queues=frozenset({"a"}), routes=frozenset({("x", "k")}))
    assert store.purge(selection) == Purged(parked=2)
    assert client.hkeys(msg) == ["junk"]
    (junk,) = store.claim(7200.0, 30.0, tokens(2)).items
    assert junk.entry_id == "junk"
    store.discard("junk")  # what the mover does with an entry it cannot read
    assert store.depth() == 0
