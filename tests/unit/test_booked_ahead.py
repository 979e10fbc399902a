"""Calls booked ahead in a global bucket (pure, fake clock in microseconds)."""

from __future__ import annotations

from celery_extras.limits.booked_ahead import MAX_AHEAD, MAX_BUCKETS, BookedAhead
from tests.support.clock import FakeClock

US = 1e-6
BUCKET = ("t", ("t#0", "", 1))


def arrivals(ahead: BookedAhead, clock: FakeClock, count: int, gap_us: int) -> list[bool]:
    spent = []
    for _ in range(count):
        clock.now += gap_us * US
        spent.append(ahead.spend(BUCKET))
    return spent


def test_nothing_is_asked_ahead_before_two_arrivals_give_a_gap() -> None:
    clock = FakeClock()
    ahead = BookedAhead(clock)
    assert ahead.wanted(BUCKET, 0.01) == 0
    assert ahead.spend(BUCKET) is False
    assert ahead.wanted(BUCKET, 0.01) == 0
    assert arrivals(ahead, clock, 1, 2_500) == [False]
    assert ahead.wanted(BUCKET, 0.01) == 4  # 10,000 us at one every 2,500 us


def test_the_calls_expected_within_the_horizon_are_asked_at_most_the_limit() -> None:
    clock = FakeClock()
    ahead = BookedAhead(clock)
    arrivals(ahead, clock, 10, 100)
    assert ahead.wanted(BUCKET, 0.01) == MAX_AHEAD  # 100 expected, 32 at most
    assert ahead.wanted(BUCKET, 0.0005) == 5


def test_the_gap_is_an_average_a_single_pause_does_not_reset() -> None:
    clock = FakeClock()
    ahead = BookedAhead(clock)
    arrivals(ahead, clock, 20, 1_000)
    arrivals(ahead, clock, 1, 9_000)  # average: 1,000 + (9,000 - 1,000) / 4 = 3,000 us
    assert ahead.wanted(BUCKET, 0.012) == 4


def test_calls_booked_ahead_are_spent_by_the_next_arrivals_within_the_horizon() -> None:
    clock = FakeClock()
    ahead = BookedAhead(clock)
    arrivals(ahead, clock, 2, 1_000)
    ahead.booked(BUCKET, 3, 0.01)
    assert arrivals(ahead, clock, 4, 1_000) == [True, True, True, False]
    assert ahead.spent == 3


def test_calls_booked_ahead_are_not_spent_after_the_horizon_and_are_dropped() -> None:
    clock = FakeClock()
    ahead = BookedAhead(clock)
    arrivals(ahead, clock, 2, 1_000)
    ahead.booked(BUCKET, 3, 0.01)
    assert arrivals(ahead, clock, 1, 10_000) == [True]  # at the horizon: still spent
    assert arrivals(ahead, clock, 1, 1) == [False]  # 1 us past it: the rest is dropped
    ahead.booked(BUCKET, 0, 0.01)
    assert arrivals(ahead, clock, 1, 1) == [False]
    assert ahead.spent == 1


def test_buckets_are_apart_and_unknown_ones_are_not_booked() -> None:
    clock = FakeClock()
    ahead = BookedAhead(clock)
    other = ("t", ("t#0", "customer-2", 1))
    arrivals(ahead, clock, 2, 1_000)
    ahead.booked(other, 5, 0.01)  # never arrived: nothing to spend it
    ahead.booked(BUCKET, 1, 0.01)
    assert ahead.spend(other) is False
    assert ahead.spend(other) is False
    assert arrivals(ahead, clock, 2, 10) == [True, False]


def test_idle_buckets_are_forgotten_when_there_are_too_many() -> None:
    clock = FakeClock()
    ahead = BookedAhead(clock)
    for i in range(MAX_BUCKETS):
        ahead.spend(("t", i))
    clock.now += 1.5
    ahead.spend(BUCKET)
    ahead.spend(("t", "new"))
    assert ahead.wanted(("t", 0), 0.01) == 0
    assert len(ahead._buckets) == 2
