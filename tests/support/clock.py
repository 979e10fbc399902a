"""Clocks the test moves by hand: for the pure algorithms' injectable clocks, and simulated
time for all of celery-extras at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery_extras import clock
from celery_extras.testing.clock import SimulatedClock

__all__ = ["FakeClock", "simulated", "store_clock"]


def store_clock(client: Any) -> Callable[[], float]:
    """The store's own clock (``TIME``), in the milliseconds its scripts read it in: a Redis
    table's harness asks its rules on the clock the scripts keep."""

    def now() -> float:
        seconds, micros = client.time()
        return float(seconds) + micros // 1000 / 1000

    return now


@contextmanager
def simulated(start: float) -> Iterator[SimulatedClock]:
    """Every celery-extras clock (and store script) on a :class:`SimulatedClock` at *start*."""
    sim = SimulatedClock(start=start)
    clock.simulate(sim)
    try:
        yield sim
    finally:
        clock.simulate(None)


class FakeClock:
    """``clock()`` returns ``clock.now``; tests set or advance ``now`` themselves."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
