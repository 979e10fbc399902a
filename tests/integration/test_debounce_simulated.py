"""Debounce in simulated time (the users' plugin, on the project's own tests):
``extras_clock.advance()`` moves quiet periods and ``max_wait`` bounds, with exact figures."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from celery_extras import SimulatedClock, clock, debounce

STARTED: list[tuple[float, Any]] = []  # (simulated start time, tag)


@debounce(10.0, key=lambda args, kwargs: args[0], max_wait=30.0)
@shared_task(name="tests.simulated.recompute")
def recompute(account: str, tag: Any) -> Any:
    STARTED.append((clock.wall(), tag))
    return tag


def since(extras_clock: SimulatedClock) -> list[tuple[float, Any]]:
    return [(round(t - extras_clock.start, 3), tag) for t, tag in STARTED]


def test_a_burst_runs_once_quiet_for_wait_with_its_last_message(
    extras_worker: Any, extras_clock: SimulatedClock
) -> None:
    STARTED.clear()
    results = [recompute.delay("acme", i) for i in range(3)]
    extras_clock.advance(3)
    results.append(recompute.delay("acme", 3))  # quiet again from here
    other = recompute.delay("globex", "g")
    extras_clock.advance(9.9)
    assert not any(r.ready() for r in results) and since(extras_clock) == []
    extras_clock.advance(0.1)  # 10 s after the last message of each key
    assert [r.get(timeout=10) for r in results] == [3, 3, 3, 3]
    assert other.get(timeout=10) == "g"
    assert set(since(extras_clock)) == {(13.0, 3), (13.0, "g")}


def test_a_steady_stream_runs_max_wait_after_its_first_message(
    extras_worker: Any, extras_clock: SimulatedClock
) -> None:
    STARTED.clear()
    results = []
    for i in range(10):  # one every 4 s: never quiet for 10 s
        results.append(recompute.delay("acme", i))
        extras_clock.advance(4)
    extras_clock.advance(20)
    assert [r.get(timeout=10) for r in results] == [7] * 8 + [9, 9]
    assert since(extras_clock) == [(30.0, 7), (46.0, 9)]  # max_wait; then 10 s after 36
