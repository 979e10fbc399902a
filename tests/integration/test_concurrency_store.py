"""The concurrency slot scripts against a real Redis and the 3-master Redis Cluster.

No worker and no broker here (the store is Redis whatever the broker).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_extras.admission.gate import HolderIds
from celery_extras.admission.notices import parse_notice
from celery_extras.concurrency.redis_slots import RedisSlots
from celery_extras.concurrency.slots import TICKET_LEASE, StoreSlots
from celery_extras.store.health import StoreHealth
from tests.support.clock import FakeClock
from tests.support.topology import RedisClusterTopology
from tests.support.workers import wait_for


@pytest.fixture
def store(client: Any) -> Iterator[RedisSlots]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield RedisSlots(client, prefix)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


def take(store: RedisSlots, holder: str, worker: str = "w1", cap: int = 2, key: str = "",
         lease: float = 30.0, more: bool = False) -> float:  # fmt: skip
    return store.acquire("t", key, holder, cap, lease, worker, more, 3.0)


def test_cap_holds_and_release_frees_and_empties_the_bucket(store: RedisSlots, client: Any) -> None:
    assert take(store, "a") == 0.0 and take(store, "b") == 0.0
    retry = take(store, "c")
    assert 29.0 < retry <= 30.0  # the earliest lease's end: when a slot frees at the latest
    assert take(store, "a") == 0.0  # a holder asking again keeps its one slot
    assert store.holding("t") == 2
    assert store.release("t", "", "a") and not store.release("t", "", "a")
    assert take(store, "c") == 0.0  # w1's ticket was first in the queue
    assert store.release("t", "", "b") and store.release("t", "", "c")
    assert [k for k in client.scan_iter(f"{store.prefix}:*")] == []  # idle: nothing stored


def test_an_expired_lease_is_reclaimed_and_renewal_keeps_it(store: RedisSlots) -> None:
    assert take(store, "a", lease=1.0) == 0.0 and take(store, "b", lease=1.0) == 0.0
    time.sleep(0.5)
    assert store.renew("t", "", ["a"], 1.0) == []
    wait_for(lambda: store.holding("t") == 1, timeout=3.0, what="b's lease to run out")
    assert store.renew("t", "", ["a", "b"], 1.0) == ["b"]  # b was reclaimed
    assert take(store, "c", lease=1.0) == 0.0


def test_the_longest_waiting_worker_is_served_first_then_goes_to_the_back(
    store: RedisSlots,
) -> None:
    assert take(store, "h", cap=1) == 0.0
    assert take(store, "x1", worker="w1", cap=1) > 0  # w1 waits first
    assert take(store, "x2", worker="w2", cap=1) > 0
    store.release("t", "", "h")
    # w2 is faster to ask, but w1 waited longer: w2 is refused, and told to ask again soon
    assert 0 < take(store, "x2", worker="w2", cap=1) <= 3.0
    assert take(store, "x1", worker="w1", cap=1, more=True) == 0.0  # w1 has more waiting
    store.release("t", "", "x1")
    assert take(store, "y1", worker="w1", cap=1) > 0  # w1 went to the back: w2's turn
    assert take(store, "x2", worker="w2", cap=1) == 0.0


def test_a_dead_waiters_ticket_goes_with_its_lease(store: RedisSlots) -> None:
    assert store.acquire("t", "", "x", 1, 30.0, "dead", False, 3.0) == 0.0
    assert store.acquire("t", "", "y", 1, 30.0, "dead2", False, 0.3) > 0  # dies while waiting
    store.release("t", "", "x")
    assert take(store, "z", worker="alive", cap=1) > 0  # dead2 is still in front...
    time.sleep(0.4)
    assert take(store, "z", worker="alive", cap=1) == 0.0  # ...until its ticket runs out


def test_a_worker_blocked_past_its_tickets_lease_learns_it_is_no_longer_queued(
    store: RedisSlots,
) -> None:
    """A release is announced only to the workers queued: one whose ticket ran out (its
    loop blocked past the ticket's lease) learns it as it keeps its tickets, and its queue
    asks again (which queues it again); a ticket still there is kept."""
    clock = FakeClock()
    health = StoreHealth(clock=clock).user(logging.getLogger("test"), "slots", "")
    slots = StoreSlots(lambda: store, health, HolderIds(), clock)
    bucket = ("t", "")
    assert take(store, "h", worker="other", cap=1) == 0.0

    def queued_for(ticket_lease: float) -> None:  # as its take would, with a shorter lease
        assert store.acquire("t", "", "x", 1, 30.0, slots.worker, False, ticket_lease) > 0
        slots.tickets[bucket] = clock()
        clock.now += TICKET_LEASE  # due to be kept alive

    queued_for(0.3)
    assert slots.keep_tickets(lambda b: 1) == []  # still queued: kept for TICKET_LEASE
    queued_for(0.3)
    time.sleep(0.4)
    assert take(store, "y", worker="third", cap=1) > 0  # its script drops the ticket run out
    assert slots.keep_tickets(lambda b: 1) == [bucket]


def test_release_notifies_subscribers(store: RedisSlots, client: Any) -> None:
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.channel)
    try:
        take(store, "a", key="k1")
        take(store, "b", key="k1")
        take(store, "c", key="k1")  # someone waits: the release is announced
        time.sleep(0.1)
        store.release("t", "k1", "a")
        message = wait_for(lambda: pubsub.get_message(timeout=0.1), timeout=5.0)
        assert parse_notice(message["data"]) == ("t", "k1")
    finally:
        pubsub.close()


def test_a_release_nobody_waits_for_is_not_announced(store: RedisSlots, client: Any) -> None:
    """Every worker hears every notice: a release announced with no waiter would cost each
    of them a message per task that ends."""
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.channel)
    try:
        take(store, "a", key="idle")
        take(store, "b", key="idle")
        assert store.release("t", "idle", "a")  # "b" still holds, nobody waits
        take(store, "c", key="busy")
        take(store, "d", key="busy")
        take(store, "e", key="busy")  # waits
        assert store.release("t", "busy", "c")
        message = wait_for(lambda: pubsub.get_message(timeout=0.1), timeout=5.0)
        assert parse_notice(message["data"]) == ("t", "busy")  # the first notice
    finally:
        pubsub.close()


def test_keys_share_one_hash_tag_and_buckets_spread(
    redis_cluster_topology: RedisClusterTopology,
) -> None:
    client = redis_cluster_topology.client()
    store = RedisSlots(client, f"t{uuid.uuid4().hex[:10]}")
    try:
        nodes = set()
        for n in range(12):
            keys = store.keys("t", f"customer-{n}")
            slots = {client.keyslot(k) for k in keys}
            assert len(slots) == 1
            nodes.add(client.get_node_from_key(keys[0]).port)
            assert take(store, f"h{n}", key=f"customer-{n}", cap=1) == 0.0
        assert nodes == set(redis_cluster_topology.ports)
        for n in range(12):
            assert store.release("t", f"customer-{n}", f"h{n}")
    finally:
        for key in client.scan_iter(f"{store.prefix}:*"):
            client.delete(key)


def test_run_time_caps_are_read_within_the_refresh(store: RedisSlots) -> None:
    store.set_cap("t", 3)
    assert store.caps() == {"t": 3}
    store.client.hset(store.caps_key, "bad", "x")
    store.client.hset(store.caps_key, "zero", "0")
    store.set_cap("t", None)
    assert store.caps() == {}


def test_a_release_hands_the_slot_to_the_same_worker_unless_another_waited_long(
    store: RedisSlots,
) -> None:
    def hand(old: str, new: str, worker: str, patience: float) -> bool:
        return store.hand_over("t", "", old, new, 1, 30.0, worker, False, patience, 3.0)

    assert take(store, "a", worker="w1", cap=1) == 0.0
    assert take(store, "x", worker="w2", cap=1) > 0  # w2 waits
    assert hand("a", "b", "w1", patience=1.0)  # w2 waited less than the patience
    assert store.holding("t") == 1 and not store.release("t", "", "a")
    time.sleep(0.25)
    assert not hand("b", "c", "w1", patience=0.2)  # w2 waited longer: the slot is free
    assert store.holding("t") == 0
    assert take(store, "c", worker="w1", cap=1) > 0  # and it is w2's turn
    assert take(store, "x", worker="w2", cap=1) == 0.0
