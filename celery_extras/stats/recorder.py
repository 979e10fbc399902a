"""Per task name counters of what a worker did, on time wheels, and the figures they give.

A :class:`Recorder` keeps one :func:`~.timewheel.minute_wheel` per task name and
counts the events of the stats contract in it (:data:`COUNTERS`). Recording is a
clock reading, a dict lookup and a list increment, lock-free: the worker calls it
from one thread.
:class:`LockedRecorder` is the same behind a lock, for pools whose callbacks run
in several threads. At most ``max_tasks`` names get their own wheel; events of
further names are counted under :data:`OTHER` so foreign messages cannot grow
memory without bound.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..clock import monotonic
from .histogram import SCALE, Histogram
from .timewheel import Bucket, Clock, TimeWheel, minute_wheel

__all__ = [
    "BASE_COUNTERS",
    "BATCHED",
    "CONCURRENCY_LIMITED",
    "COUNTERS",
    "FAILED",
    "IGNORED",
    "OTHER",
    "PARKED",
    "PERCENTILES",
    "RATE_LIMITED",
    "RECEIVED",
    "REJECTED",
    "RELEASED",
    "RETRIED",
    "REVOKED",
    "SHADOW_LIMITED",
    "STARTED",
    "SUCCEEDED",
    "LockedRecorder",
    "Recorder",
]

#: The counters every ``worker-throughput`` event has had from the start.
BASE_COUNTERS = (
    "received",
    "started",
    "succeeded",
    "failed",
    "retried",
    "rejected",
    "revoked",
    "rate_limited",
)
#: The counters of the ``worker-throughput`` event, in this order: the base ones, then
#: those added later (a monitor reads them as 0 from a worker that does not send them).
COUNTERS = (
    *BASE_COUNTERS,
    "ignored",
    "parked",
    "released",
    "concurrency_limited",
    "coalesced",
    "shadow_limited",
    "batched",
    "debounced",
    "memoized",
)
(
    RECEIVED,
    STARTED,
    SUCCEEDED,
    FAILED,
    RETRIED,
    REJECTED,
    REVOKED,
    RATE_LIMITED,
    IGNORED,
    PARKED,
    RELEASED,
    CONCURRENCY_LIMITED,
    COALESCED,
    SHADOW_LIMITED,
    BATCHED,
    DEBOUNCED,
    MEMOIZED,
) = range(len(COUNTERS))
#: The runtime percentiles reported, as ``p<n>`` keys.
PERCENTILES = (50, 95, 99)
#: Name under which events of task names beyond ``max_tasks`` are counted.
OTHER = "<other>"


class Recorder:
    """Counts per task name on time wheels; :meth:`snapshot` gives the contract's figures.

    Within one round (bucket width) of the wheels, a name's current bucket is
    remembered, so recording an event is one clock reading, one comparison and
    one dict lookup; the first event of a name in a round finds its bucket.
    """

    def __init__(
        self,
        clock: Clock = monotonic,
        max_tasks: int = 1000,
        wheel: Callable[[int, Clock], TimeWheel] = minute_wheel,
    ) -> None:
        if max_tasks < 1:
            raise ValueError(f"max_tasks must be >= 1, got {max_tasks!r}")
        self.clock = clock
        self.max_tasks = max_tasks
        self._make_wheel = wheel
        self._wheels: dict[str, TimeWheel] = {}
        self._width = wheel(len(COUNTERS), clock).width
        self._round_end = -math.inf  # when the clock reaches it, the buckets below are stale
        self._buckets: dict[Any, Bucket] = {}  # name -> its wheel's bucket of this round

    def _bucket(self, name: Any, now: float) -> Bucket:
        """*name*'s bucket of now: the round's, or found on its wheel (made if new)."""
        if now >= self._round_end:
            self._round_end = (math.floor(now / self._width) + 1) * self._width
            self._buckets.clear()
        bucket = self._buckets.get(name)
        if bucket is None:
            key = name if isinstance(name, str) else str(name)[:200]
            wheel = self._wheels.get(key)
            if wheel is None and len(self._wheels) >= self.max_tasks:
                return self._wheel(OTHER).current(now)  # not remembered: names are unbounded
            if wheel is None:
                wheel = self._wheel(key)
            bucket = self._buckets[name] = wheel.current(now)
        return bucket

    def _wheel(self, name: str) -> TimeWheel:
        wheel = self._wheels.get(name)
        if wheel is None:
            wheel = self._wheels[name] = self._make_wheel(len(COUNTERS), self.clock)
        return wheel

    def count(self, name: str, counter: int, n: int = 1) -> None:
        """Add *n* to *counter* (an index into :data:`COUNTERS`) of task *name*, now."""
        now = self.clock()
        bucket = self._buckets.get(name) if now < self._round_end else None
        if bucket is None:
            bucket = self._bucket(name, now)
        bucket.counts[counter] += n

    def succeeded(self, name: str, seconds: float) -> None:
        """Count a success of task *name* whose run took *seconds*."""
        now = self.clock()
        bucket = self._buckets.get(name) if now < self._round_end else None
        if bucket is None:
            bucket = self._bucket(name, now)
        bucket.counts[SUCCEEDED] += 1
        bucket.add_runtime(seconds)

    def runtime(self, name: str, seconds: float) -> None:
        """Record that a run of task *name* took *seconds*."""
        self._bucket(name, self.clock()).add_runtime(seconds)

    def names(self) -> list[str]:
        return sorted(self._wheels)

    def check_windows(self, windows: Sequence[float]) -> None:
        """Raise :class:`ValueError` when the wheels cannot answer one of *windows*."""
        self._make_wheel(len(COUNTERS), self.clock).check_windows(windows)

    def snapshot(self, windows: Sequence[float], partial: bool = False) -> dict[str, Any]:
        """The event's figures: ``windows``, ``tasks`` and ``runtime_scale``.

        Per task name: each counter's count per window, ``runtime`` (over the longest
        window, ``None`` percentiles when empty), ``total`` (each counter since the
        worker started) and ``runtime_total`` (count, sum and the non-empty log-scale
        buckets ``[[index, count], ...]`` of every successful run since the worker
        started; ``runtime_scale`` says what an index means). Every name with
        anything counted since the start is listed.
        """
        tasks: dict[str, Any] = {}
        for name in sorted(self._wheels):
            wheel = self._wheels[name]
            totals = wheel.totals()
            if not any(totals.counts) and totals.runtime is None:
                continue
            summary = wheel.summary(windows, partial)
            figures: dict[str, Any] = {
                counter: [row[i] for row in summary.counts] for i, counter in enumerate(COUNTERS)
            }
            hist = summary.runtime
            figures["runtime"] = {
                "count": hist.count,
                "sum": hist.total,
                "max": hist.high,
                **{f"p{p}": hist.percentile(p) for p in PERCENTILES},
            }
            figures["total"] = dict(zip(COUNTERS, totals.counts, strict=True))
            every = totals.runtime or Histogram()
            figures["runtime_total"] = {
                "count": every.count,
                "sum": every.total,
                "buckets": [[i, n] for i, n in sorted(every.buckets.items())],
            }
            tasks[name] = figures
        return {"windows": list(windows), "tasks": tasks, "runtime_scale": dict(SCALE)}


class LockedRecorder(Recorder):
    """A :class:`Recorder` safe to call from several threads (threads pool, no event loop)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()

    def count(self, name: str, counter: int, n: int = 1) -> None:
        with self._lock:
            super().count(name, counter, n)

    def succeeded(self, name: str, seconds: float) -> None:
        with self._lock:
            super().succeeded(name, seconds)

    def runtime(self, name: str, seconds: float) -> None:
        with self._lock:
            super().runtime(name, seconds)

    def snapshot(self, windows: Sequence[float], partial: bool = False) -> dict[str, Any]:
        with self._lock:
            return super().snapshot(windows, partial)
