"""The global bucket's script against a real Redis, fed hostile store contents (issue 17).

No worker and no broker here (the store is Redis whatever the broker), so these
tests are not parametrized over brokers.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_extras.bounds import MAX_WAIT
from celery_extras.limits.rate import MIN_RATE
from celery_extras.limits.redis_bucket import GlobalTokenBucket, LimitTake
from tests.support.brokers import REDIS_URL
from tests.support.clock import simulated


@pytest.fixture
def client() -> redis.Redis[str]:
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


@pytest.fixture
def bucket(client: redis.Redis[str]) -> Iterator[GlobalTokenBucket]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield GlobalTokenBucket(client, prefix)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


@pytest.mark.parametrize("stored", ["1e300", "inf", "-1e300", "abc", "", "9" * 400])
def test_a_garbage_bucket_time_reads_as_a_full_bucket(
    bucket: GlobalTokenBucket, client: redis.Redis[str], stored: str
) -> None:
    client.set(bucket.bucket_key("t"), stored)
    waits = [bucket.reserve("t", 10.0, 2) for _ in range(3)]
    assert waits[:2] == [0.0, 0.0] and waits[2] == pytest.approx(0.1, abs=0.01)
    assert 0 < client.pttl(bucket.bucket_key("t")) <= 2000


@pytest.mark.parametrize(
    "stored",
    [json.dumps({"rate": 1e-300}), json.dumps({"rate": 1e308}), json.dumps({"rate": -1}),
     json.dumps({"rate": 1000, "burst": 1e30}), json.dumps({"rate": 1000, "burst": 0.5}),
     json.dumps({"rate": "1000"}), json.dumps([1000]), "not json", "{" * 10_000],
)  # fmt: skip
def test_an_override_out_of_bounds_is_ignored_and_logged_once(
    bucket: GlobalTokenBucket,
    client: redis.Redis[str],
    caplog: pytest.LogCaptureFixture,
    stored: str,
) -> None:
    client.hset(bucket.overrides_key, "t", stored)
    # the script's clock stands still between the calls (on a loaded machine 120 ms passed
    # between the first and the fourth, seen on Celery 5.5's CI run)
    with simulated(2_000_000_000.0), caplog.at_level(logging.ERROR):
        waits = [bucket.reserve("t", 10.0, 1) for _ in range(4)]
    assert waits[0] == 0.0 and waits[3] == pytest.approx(0.3, abs=1e-6)  # the task's 10/s
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and "ignoring the stored run-time limit of 't'" in logged[0]


def test_an_override_within_bounds_applies(
    bucket: GlobalTokenBucket, client: redis.Redis[str]
) -> None:
    client.hset(bucket.overrides_key, "t", json.dumps({"rate": 100, "burst": 3}))
    with simulated(2_000_000_000.0):  # the script's clock stands still between the calls
        waits = [bucket.reserve("t", 1.0, 1) for _ in range(4)]
    assert waits == [0.0, 0.0, 0.0, pytest.approx(0.01, abs=1e-6)]


def test_a_wait_beyond_the_longest_books_nothing_and_the_expiry_stays_bounded(
    bucket: GlobalTokenBucket, client: redis.Redis[str]
) -> None:
    waits = [bucket.reserve("t", MIN_RATE, 1) for _ in range(32)]
    assert waits[30] == pytest.approx(30 * 86400.0, abs=1)
    assert waits[31] > MAX_WAIT  # not booked: the next caller is told the same
    assert bucket.reserve("t", MIN_RATE, 1) == pytest.approx(waits[31], abs=1)
    assert client.pttl(bucket.bucket_key("t")) <= (MAX_WAIT + 86400 + 1) * 1000


def test_several_limits_in_one_script_follow_the_pure_rule(bucket: GlobalTokenBucket) -> None:
    """The script and :func:`~celery_extras.limits.all_of.admit_all` (through the fake
    store) give the same waits, bindings and bookings for one sequence of calls: broad and
    per-key buckets, costs, a floor, shadow buckets. Both read one simulated clock: a model
    on Redis' own clock, read a round trip after the script, was 7 ms late on a loaded CI
    run."""
    from tests.support.fake_global import FakeGlobal

    broad = LimitTake("t", "", 10.0, 2, 1)
    per_key = LimitTake("t#2", "a", 2.0, 1, 1, narrow=True)
    calls = [
        ([broad, per_key], [], 0.0),
        ([broad, per_key], [], 0.0),  # the key binds: it books, the broad one does not
        ([broad, LimitTake("t#2", "b", 2.0, 1, 1, narrow=True)], [], 0.0),
        ([LimitTake("t", "", 10.0, 2, 2), per_key], [], 0.0),  # cost 2
        ([broad], [], 0.35),  # a worker limit asks 0.35 s: nothing booked but the narrow
        ([broad], [LimitTake("t#3", "", 1.0, 1, 1)], 0.0),  # admitted: the shadow one is taken
        ([broad], [LimitTake("t#3", "", 1.0, 1, 1)], 0.0),
        ([LimitTake("t", "", 10.0, 2, 0), per_key], [], 0.0),  # cost 0 in the broad one
    ]
    with simulated(2_000_000_000.0) as sim:
        model = FakeGlobal(sim.wall)
        for enforcing, shadow, floor in calls:
            real = bucket.acquire("t", enforcing, shadow, floor, tagged=True)
            modelled = model.acquire("t", enforcing, shadow, floor)
            assert (real.binding, real.booked) == (modelled.binding, modelled.booked), (
                enforcing, real, modelled)  # fmt: skip
            assert real.wait == pytest.approx(modelled.wait, abs=1e-5)
            assert real.waits == pytest.approx(modelled.waits, abs=1e-5)
            sim.advance(0.001)


def _acquire_ahead(bucket: GlobalTokenBucket, takes: list[Any], ahead: int, horizon: float,
                   shadow: tuple[Any, ...] = ()) -> Any:  # fmt: skip
    call = bucket.acquire_call("t", takes, shadow, 0.0, len(takes) > 1, ahead, horizon)
    return bucket.acquired(call, call())


def test_a_fast_bucket_books_ahead_up_to_the_count_asked_and_moves_for_one(
    bucket: GlobalTokenBucket,
) -> None:
    """10,000/s, burst 1, a fresh (full) bucket: 100 slots of 100 us passed unused within
    a 10 ms horizon, 32 asked, 32 booked; the bucket's time moves for the call that goes
    now alone (the slots booked ahead are past)."""
    take = LimitTake("t", "", 10_000.0, 1, 1)
    assert _acquire_ahead(bucket, [take], 32, 0.01).ahead == 32
    tat = int(bucket.client.get(bucket.bucket_key("t")) or 0)
    seconds, micros = bucket.client.time()
    assert tat - (seconds * 1_000_000 + micros) <= 100


def test_nothing_is_booked_ahead_when_a_bucket_binds_or_a_shadow_limit_watches(
    bucket: GlobalTokenBucket,
) -> None:
    """10/s: a slot every 100 ms, none within a 50 ms horizon, even of a full bucket; the
    next call waits. A shadow limit's bucket is taken only when the call goes: none."""
    slow = LimitTake("t", "", 10.0, 5, 1)
    assert _acquire_ahead(bucket, [slow], 10, 0.05).ahead == 0
    fast = LimitTake("t#1", "", 100_000.0, 1, 1)
    shadow = (LimitTake("t#2", "", 100_000.0, 1, 1),)
    assert _acquire_ahead(bucket, [fast], 10, 0.05, shadow).ahead == 0


def test_several_buckets_book_ahead_what_the_tightest_let_pass(bucket: GlobalTokenBucket) -> None:
    """Both buckets of a call book the same calls ahead: as many as the tighter one let
    pass within the horizon (20/s: 2 in 105 ms), and move for one call (the next waits
    for the tighter one's next slot, 50 ms on)."""
    fast = LimitTake("t", "", 100_000.0, 1, 1)
    tighter = LimitTake("t#1", "", 20.0, 1, 1)
    got = _acquire_ahead(bucket, [fast, tighter], 32, 0.105)
    assert got.ahead == 2 and got.booked == (True, True)
    assert 0 < _acquire_ahead(bucket, [fast, tighter], 32, 0.105).wait <= 0.05


def test_only_a_bucket_that_stood_full_books_ahead_as_many_slots_as_it_let_pass(
    bucket: GlobalTokenBucket,
) -> None:
    """1,000/s, burst 5, a horizon of 50 ms: a bucket just taken is not full (it may
    bind: a call booked ahead and not spent would be capacity lost), and books none
    ahead; left 20 ms, it is full again after 1 ms and let about 19 slots pass."""
    take = LimitTake("t", "", 1_000.0, 5, 1)
    assert _acquire_ahead(bucket, [take], 0, 0.05).ahead == 0
    assert _acquire_ahead(bucket, [take], 32, 0.05).ahead == 0
    time.sleep(0.02)
    assert 12 <= _acquire_ahead(bucket, [take], 32, 0.05).ahead <= 22
