"""Under simulated time the store's scripts read it (issue 26): parked entries fall due,
buckets refill and leases run out when the test advances the clock, not before."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from celery_extras.concurrency.redis_slots import RedisSlots
from celery_extras.delay.redis_store import RedisDelayStore, delay_keys
from celery_extras.limits.redis_bucket import GlobalTokenBucket, LimitTake
from celery_extras.testing.clock import SimulatedClock
from tests.support.brokers import REDIS_URL
from tests.support.clock import simulated
from tests.unit.test_delay_core import make_entry

START = 2_000_000_000.0


@pytest.fixture
def sim() -> Iterator[SimulatedClock]:
    with simulated(START) as clock_:
        yield clock_


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    prefix = f"simtime-{uuid.uuid4().hex[:8]}"
    connection.prefix = prefix  # type: ignore[attr-defined]
    try:
        yield connection
    finally:
        for key in connection.scan_iter(match=f"*{prefix}*"):
            connection.delete(key)
        connection.close()


def test_a_parked_entry_is_due_on_the_simulated_clock(
    sim: SimulatedClock, client: redis.Redis
) -> None:
    store = RedisDelayStore(client, client.prefix)  # type: ignore[attr-defined]
    assert store.park("e1", make_entry(), 3600.0)
    assert client.zscore(delay_keys(client.prefix)["due"], "e1") == (START + 3600) * 1000  # type: ignore[attr-defined]
    assert store.claim(0.0, 10.0, ["tok"]).items == []
    sim.advance(3599.999)
    assert store.claim(0.0, 10.0, ["tok"]).items == []
    sim.advance(0.001)
    assert [c.entry_id for c in store.claim(0.0, 10.0, ["tok"]).items] == ["e1"]


def test_a_bucket_refills_on_the_simulated_clock(sim: SimulatedClock, client: redis.Redis) -> None:
    bucket = GlobalTokenBucket(client, client.prefix)  # type: ignore[attr-defined]
    take = [LimitTake("t", "", 1.0, 1, 1)]
    assert bucket.acquire("t", take).wait == 0.0
    assert bucket.acquire("t", take).wait == pytest.approx(1.0)  # the next second's token
    sim.advance(1.0)
    assert bucket.acquire("t", take).wait == pytest.approx(1.0)  # booked above: now 2 s


def test_a_slot_lease_runs_out_on_the_simulated_clock(
    sim: SimulatedClock, client: redis.Redis
) -> None:
    slots = RedisSlots(client, client.prefix)  # type: ignore[attr-defined]
    assert slots.acquire("t", "", "h1", 1, 30.0, "w1", False, 60.0) == 0.0
    assert slots.acquire("t", "", "h2", 1, 30.0, "w1", False, 60.0) > 0.0  # taken
    sim.advance(29.9)
    assert slots.acquire("t", "", "h2", 1, 30.0, "w1", False, 60.0) > 0.0
    sim.advance(0.2)
    assert slots.acquire("t", "", "h2", 1, 30.0, "w1", False, 60.0) == 0.0  # h1's lease ran out
