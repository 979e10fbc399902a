"""The clocks every part of celery-extras reads: real time, or a test's simulated time.

Each pure core takes an injectable clock; its default is :func:`monotonic` or :func:`wall`
here, which read the real clocks unless :func:`simulate` handed them a source (the testing
plugin's ``extras_clock``). The store's scripts are told the time the same way
(:func:`store_time`): the Redis server's own ``TIME`` normally, the simulated time under
simulation. What measures real durations (store outages, timeouts) reads ``time`` itself.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["TimeSource", "monotonic", "simulate", "simulated", "store_time", "wall"]


class TimeSource(Protocol):
    """Simulated time: both clocks, in seconds."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


_source: TimeSource | None = None


def monotonic() -> float:
    """Seconds on a clock that never goes back (:func:`time.monotonic`, or simulated)."""
    return time.monotonic() if _source is None else _source.monotonic()


def wall() -> float:
    """Seconds since the epoch (:func:`time.time`, or simulated)."""
    return time.time() if _source is None else _source.wall()


def store_time() -> str:
    """The time a store script is told: ``""`` (the server's ``TIME``: workers' clocks do
    not matter), or the simulated wall time in whole microseconds."""
    return "" if _source is None else str(round(_source.wall() * 1_000_000))


def simulated() -> bool:
    """``True`` while a simulated source is in use."""
    return _source is not None


def simulate(source: TimeSource | None) -> None:
    """Read *source* from now on (``None``: real time again)."""
    global _source
    _source = source
