"""Calls a worker booked ahead in a global bucket, spent by its next arrivals unasked.

A worker draining a task whose global limit does not bind asks the store once per task.
When the task's calls arrive within the late tolerance of a booked slot of each other,
the store books the next few with the one that goes now (``scripts/bucket_acquire.lua``),
on slots the bucket let pass unused within a horizon (half that tolerance) while it
stood full: the worker's next arrivals spend them within the horizon, so each is late by
at most the tolerance, never early. How many to ask for: the arrivals expected within
the horizon, from the average gap between the last ones, so that few go unspent (one
unspent is capacity the bucket let pass anyway). No Celery import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["MAX_AHEAD", "BookedAhead"]

#: Calls booked ahead at most in one round trip.
MAX_AHEAD = 32
#: Weight of the latest gap between two arrivals in their average.
SMOOTHING = 0.25
#: Buckets remembered at most (a per-key limit has one per key): the idle ones go first.
MAX_BUCKETS = 4096
#: Seconds after its last arrival a bucket is idle (its average gap forgotten).
IDLE = 1.0


@dataclass
class _Arrivals:
    """One bucket's arrivals: the last, the average gap, the calls booked ahead unspent
    and until when they may be spent."""

    last: float
    gap: float = math.inf
    left: int = 0
    until: float = 0.0


class BookedAhead:
    """Calls booked ahead per bucket (any hashable naming a task's buckets and costs)."""

    def __init__(self, clock: Callable[[], float], limit: int = MAX_AHEAD) -> None:
        self.clock = clock
        self.limit = limit
        self._buckets: dict[Hashable, _Arrivals] = {}
        self.spent = 0  # calls admitted on a slot booked ahead, since the start

    def spend(self, bucket: Hashable) -> bool:
        """A call of *bucket* arrives: ``True`` when it takes a call booked ahead (it goes
        now, unasked), else the store is to be asked."""
        now = self.clock()
        seen = self._buckets.get(bucket)
        if seen is None:
            self._forget_idle(now)
            self._buckets[bucket] = _Arrivals(now)
            return False
        gap = now - seen.last
        seen.gap = gap if math.isinf(seen.gap) else seen.gap + SMOOTHING * (gap - seen.gap)
        seen.last = now
        if seen.left and now <= seen.until:
            seen.left -= 1
            self.spent += 1
            return True
        seen.left = 0
        return False

    def wanted(self, bucket: Hashable, horizon: float) -> int:
        """How many of *bucket*'s next calls to book ahead: those expected within
        *horizon* seconds at the average gap."""
        seen = self._buckets.get(bucket)
        if seen is None or math.isinf(seen.gap):
            return 0
        if seen.gap <= 0:
            return self.limit
        return min(self.limit, int(horizon / seen.gap + 1e-9))  # 1e-9: float error

    def booked(self, bucket: Hashable, count: int, horizon: float) -> None:
        """The store booked *count* calls of *bucket* ahead, now: spendable for *horizon* s."""
        seen = self._buckets.get(bucket)
        if seen is not None and count > 0:
            seen.left, seen.until = count, self.clock() + horizon

    def _forget_idle(self, now: float) -> None:
        if len(self._buckets) < MAX_BUCKETS:
            return
        for bucket in [b for b, seen in self._buckets.items() if now - seen.last > IDLE]:
            del self._buckets[bucket]
        if len(self._buckets) >= MAX_BUCKETS:
            self._buckets.clear()
