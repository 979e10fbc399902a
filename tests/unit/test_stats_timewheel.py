"""TimeWheel with a fake clock: lazy reset by round, window sums at boundaries, the minute wheel."""

from __future__ import annotations

import pytest

from celery_extras.stats.timewheel import TimeWheel, minute_wheel
from tests.support.clock import FakeClock


def counts(wheel: TimeWheel, windows: list[float], partial: bool = False) -> list[int]:
    return [row[0] for row in wheel.summary(windows, partial).counts]


def test_a_window_counts_completed_buckets_and_partial_adds_the_current_one() -> None:
    clock = FakeClock(100.0)
    wheel = TimeWheel(1, clock=clock)
    wheel.add(0, 3)  # round 100
    clock.now = 100.999999
    wheel.add(0)  # still round 100
    assert counts(wheel, [1, 10]) == [0, 0]  # round 100 is still being filled
    assert counts(wheel, [1, 10], partial=True) == [4, 4]
    clock.now = 101.0  # boundary: round 100 is now complete
    assert counts(wheel, [1, 10]) == [4, 4]
    wheel.add(0, 5)  # round 101
    assert counts(wheel, [1, 10]) == [4, 4]
    assert counts(wheel, [1, 10], partial=True) == [5, 9]
    clock.now = 102.0
    assert counts(wheel, [1, 2, 10]) == [5, 9, 9]


def test_window_sums_at_bucket_boundaries_over_a_full_span() -> None:
    clock = FakeClock(0.0)
    wheel = TimeWheel(1, clock=clock, span=60, spare=4)
    for second in range(120):  # one event in second s, s+1 events... use second number + 1
        clock.now = second + 0.5
        wheel.add(0, second + 1)
    clock.now = 120.0  # last completed round is 119
    expected = {w: sum(s + 1 for s in range(120 - w, 120)) for w in (1, 5, 10, 59, 60)}
    assert counts(wheel, [1, 5, 10, 59, 60]) == [expected[w] for w in (1, 5, 10, 59, 60)]
    clock.now = 120.999999  # same round: same answers
    assert counts(wheel, [1, 60]) == [expected[1], expected[60]]
    clock.now = 121.0  # one more second: the window slides past round 60, no writes needed
    assert counts(wheel, [1, 60]) == [0, expected[60] - 61]


def test_stale_buckets_after_an_idle_gap_longer_than_the_wheel_are_reset_lazily() -> None:
    clock = FakeClock(10.0)
    wheel = TimeWheel(2, clock=clock, span=60, spare=4)
    for second in range(10, 70):
        clock.now = float(second)
        wheel.add(0, 2)
        wheel.add(1)
    clock.now = 70.0
    assert wheel.summary([60]).counts == [[120, 60]]
    clock.now = 70.0 + 64 * 3 + 0.25  # idle for three whole rings, landing on a used slot
    assert wheel.summary([1, 60], partial=True).counts == [[0, 0], [0, 0]]
    wheel.add(1, 7)  # the slot it lands in held round 70 - 64 * k: reset, not added to
    assert wheel.summary([1, 60], partial=True).counts == [[0, 7], [0, 7]]
    clock.now += 1
    assert wheel.summary([1, 60]).counts == [[0, 7], [0, 7]]


def test_the_spare_slots_keep_the_written_bucket_apart_from_the_oldest_read() -> None:
    clock = FakeClock(0.0)
    wheel = TimeWheel(1, clock=clock, span=60, spare=1)
    clock.now = 0.5
    wheel.add(0, 10)  # round 0, slot 0
    clock.now = 60.5  # round 60: the 60 s window of completed buckets is rounds 0..59
    assert counts(wheel, [60]) == [10]
    wheel.add(0, 1)  # round 60 writes slot 60 % 61 = 60, not round 0's slot
    assert counts(wheel, [60]) == [10]
    assert counts(wheel, [60], partial=True) == [1]


def test_the_minute_wheel_answers_an_hour_without_counting_twice() -> None:
    clock = FakeClock(0.0)
    wheel = minute_wheel(1, clock)
    for second in range(0, 3 * 3600, 7):  # 3 hours, one event every 7 s
        clock.now = second + 0.5
        wheel.add(0)
    clock.now = 3 * 3600.0  # last completed second 10799, in minute 179
    # the hour window is minutes 120..179: seconds 7200..10799
    in_hour = len([s for s in range(0, 3 * 3600, 7) if 7200 <= s < 10800])
    in_minute = len([s for s in range(0, 3 * 3600, 7) if 10740 <= s < 10800])
    in_10min = len([s for s in range(0, 3 * 3600, 7) if 10200 <= s < 10800])
    assert counts(wheel, [60, 600, 3600]) == [in_minute, in_10min, in_hour]


def test_the_hour_window_includes_seconds_not_yet_folded_after_idling() -> None:
    clock = FakeClock(600.0)
    wheel = minute_wheel(1, clock)
    wheel.add(0, 5)  # round 600, minute 10; never folded (no later write reuses its slot)
    clock.now = 600.0 + 20 * 60  # 20 minutes later
    assert counts(wheel, [1, 60, 3600]) == [0, 0, 5]
    clock.now = 600.0 + 70 * 60  # 70 minutes later: minute 10 is out of the hour
    assert counts(wheel, [3600]) == [0]


def test_folded_seconds_land_in_their_minute() -> None:
    clock = FakeClock(0.0)
    wheel = minute_wheel(1, clock)
    clock.now = 30.0
    wheel.add(0, 2)  # minute 0
    clock.now = 94.0  # round 94 reuses slot 94 % 64 = 30: round 30 is folded into minute 0
    wheel.add(0, 3)  # minute 1
    clock.now = 125.0  # last completed second 124, minute 2; the 2-minute window is minutes 1..2
    assert counts(wheel, [60, 120, 180]) == [3, 3, 5]
    assert wheel.coarse is not None
    assert wheel.coarse.summary([3600], partial=True).counts == [[2]]


def test_runtimes_are_summarised_over_the_longest_window() -> None:
    clock = FakeClock(0.0)
    wheel = minute_wheel(1, clock)
    clock.now = 10.0
    wheel.add_runtime(0.5)
    clock.now = 200.0
    wheel.add_runtime(2.0)
    clock.now = 201.0
    summary = wheel.summary([60, 3600])
    assert (summary.runtime.count, summary.runtime.total, summary.runtime.high) == (2, 2.5, 2.0)


@pytest.mark.parametrize("window", [0, -1, 61.5, 90, 3601, 7200])
def test_windows_the_wheels_cannot_answer_are_rejected(window: float) -> None:
    with pytest.raises(ValueError, match="window"):
        minute_wheel(1).check_windows([1, window])


def test_repeated_windows_are_rejected() -> None:
    with pytest.raises(ValueError, match="repeat"):
        minute_wheel(1).check_windows([10, 10])
