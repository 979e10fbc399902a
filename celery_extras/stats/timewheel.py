"""A time wheel: a ring of fixed-width buckets of counters, reset lazily by round number.

Bucket ``i`` of a wheel of width ``w`` holds what happened while
``floor(clock() / w) == round``; the ring has ``span + spare`` slots, the slot of
round ``r`` being ``r % len(ring)``. A write that finds its slot holding an older
round resets it first (folding the old content into a coarser wheel, if any), and a
read skips slots whose round is outside the window: no timer, no thread, and an
idle gap of any length costs nothing. The spare slots keep the slot being written
apart from the oldest slot a full-span window reads.

Windows are whole buckets. By default a window of ``W`` seconds covers the ``W /
width`` *completed* buckets before the one being filled (so a 1 s window is the
last full second, a stable rate); ``partial=True`` counts the bucket being filled
too. Windows longer than the wheel's span are answered in whole buckets of the
coarser wheel (a 60 x 1 min wheel answers up to 1 h): the coarse bucket holding
the last completed fine bucket and the ones before it, plus fine buckets not yet
folded into it, so nothing is counted twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..clock import monotonic
from .histogram import Histogram

__all__ = ["Bucket", "Summary", "TimeWheel", "minute_wheel"]

Clock = Callable[[], float]
_NEVER = -(1 << 62)


class Bucket:
    """One slot of the ring: the round it belongs to, its counters and its runtimes."""

    __slots__ = ("counts", "round", "runtime")

    def __init__(self, counters: int) -> None:
        self.round = _NEVER
        self.counts = [0] * counters
        self.runtime: Histogram | None = None

    def empty(self) -> bool:
        return self.runtime is None and not any(self.counts)

    def reset(self, round_: int) -> None:
        self.round = round_
        counts = self.counts
        for i in range(len(counts)):
            counts[i] = 0
        self.runtime = None

    def add_runtime(self, seconds: float) -> None:
        if self.runtime is None:
            self.runtime = Histogram()
        self.runtime.add(seconds)

    def absorb(self, other: Bucket) -> None:
        counts = self.counts
        for i, n in enumerate(other.counts):
            counts[i] += n
        if other.runtime is not None:
            if self.runtime is None:
                self.runtime = Histogram()
            self.runtime.merge(other.runtime)


@dataclass
class Summary:
    """Counter totals per window (aligned with the windows) and the longest window's runtimes."""

    windows: list[float]
    counts: list[list[int]]
    runtime: Histogram


class TimeWheel:
    """``span`` buckets of ``width`` seconds (plus ``spare``) of ``counters`` counters each.

    *coarse*, when given, receives each bucket's content when its slot is reused and
    answers windows longer than ``span * width``; its width must be a multiple of
    this wheel's span (a 60 x 1 s wheel feeds a wheel of 1 min buckets).
    """

    def __init__(
        self,
        counters: int,
        *,
        width: float = 1.0,
        span: int = 60,
        spare: int = 4,
        clock: Clock = monotonic,
        coarse: TimeWheel | None = None,
    ) -> None:
        if counters < 1 or width <= 0 or span < 1 or spare < 1:
            raise ValueError("a time wheel needs counters >= 1, width > 0, span >= 1, spare >= 1")
        if coarse is not None:
            ratio = coarse.width / width
            if ratio < 1 or abs(ratio - round(ratio)) > 1e-9:
                raise ValueError("the coarse wheel's width must be a multiple of this wheel's")
        self.counters = counters
        self.width: float = width
        self.span = span
        self.clock = clock
        self.coarse = coarse
        self._ring = [Bucket(counters) for _ in range(span + spare)]
        self._size = len(self._ring)
        #: what left this wheel for no coarser one: with the ring, the running totals
        self.retired = Bucket(counters)

    @property
    def seconds(self) -> float:
        """The longest window this wheel answers alone."""
        return self.span * self.width

    @property
    def longest(self) -> float:
        """The longest window this wheel answers with its coarser wheels."""
        return self.coarse.longest if self.coarse is not None else self.seconds

    def tick(self) -> int:
        """The round of the bucket being filled now."""
        return math.floor(self.clock() / self.width)

    def _turn(self, bucket: Bucket, round_: int) -> None:
        if bucket.round != _NEVER and not bucket.empty():
            if self.coarse is not None:
                self.coarse.absorb(
                    math.floor(bucket.round * self.width / self.coarse.width), bucket
                )
            else:
                self.retired.absorb(bucket)
        bucket.reset(round_)

    def current(self, now: float) -> Bucket:
        """The bucket of time *now* (a reading of :attr:`clock`), reset first if it is stale.

        It stays the bucket of now until the clock enters the next round, so a
        caller that writes many events in one round may keep it that long.
        """
        round_ = math.floor(now / self.width)
        bucket = self._ring[round_ % self._size]
        if bucket.round != round_:
            self._turn(bucket, round_)
        return bucket

    def add(self, counter: int, n: int = 1) -> None:
        """Add *n* to counter number *counter* in the bucket of now."""
        self.current(self.clock()).counts[counter] += n

    def add_runtime(self, seconds: float) -> None:
        """Record one runtime in the bucket of now."""
        self.current(self.clock()).add_runtime(seconds)

    def absorb(self, round_: int, content: Bucket) -> None:
        """Fold a finer wheel's bucket into this wheel's bucket of *round_*."""
        bucket = self._ring[round_ % self._size]
        if bucket.round != round_:
            if bucket.round > round_:  # older than this ring: outside every window
                self.retired.absorb(content)
                return
            self._turn(bucket, round_)
        bucket.absorb(content)

    def check_windows(self, windows: Sequence[float]) -> list[float]:
        """*windows* unchanged, or :class:`ValueError` naming one this wheel cannot answer."""
        if not windows:
            raise ValueError("no window asked")
        for window in windows:
            wheel = self._owner(window)
            if wheel is None or window <= 0:
                raise ValueError(f"window {window!r} s is not in (0, {self.longest:g}] s")
            buckets = window / wheel.width
            if buckets != round(buckets):
                raise ValueError(
                    f"window {window!r} s is not a whole number of {wheel.width:g} s buckets"
                )
        if len(set(windows)) != len(windows):
            raise ValueError(f"windows {list(windows)!r} repeat a window")
        return list(windows)

    def summary(self, windows: Sequence[float], partial: bool = False) -> Summary:
        """Counter totals over each of *windows* (seconds) and runtimes over the longest."""
        windows = self.check_windows(windows)
        now = self.tick()
        last = now if partial else now - 1
        longest = windows.index(max(windows))
        totals = [[0] * self.counters for _ in windows]
        runtime = Histogram()
        # per window: (width of the wheel measuring it, its first and last round there)
        for level in self._levels():
            spans: list[tuple[float, int, int] | None] = []
            for window in windows:
                owner = self._owner(window)
                if owner is None:
                    spans.append(None)
                    continue
                hi = math.floor(last * self.width / owner.width)  # owner's round of `last`
                lo = hi - round(window / owner.width) + 1
                spans.append((owner.width, lo, hi))
            for bucket in level._ring:
                r = bucket.round
                if r == _NEVER or (level is self and r > last):
                    continue
                for i, span in enumerate(spans):
                    if span is None:
                        continue
                    owner_width, lo, hi = span
                    if owner_width < level.width:
                        continue  # a finer window never reads a coarser wheel
                    owner_round = math.floor(r * level.width / owner_width)
                    if lo <= owner_round <= hi:
                        acc = totals[i]
                        for j, n in enumerate(bucket.counts):
                            acc[j] += n
                        if i == longest and bucket.runtime is not None:
                            runtime.merge(bucket.runtime)
        return Summary(windows, totals, runtime)

    def totals(self) -> Bucket:
        """Everything counted since the wheel was made: a running total (counters, runtimes).

        Each event lives in exactly one place (a bucket of a ring, or what left the
        coarsest ring), so summing them costs nothing on the write path.
        """
        total = Bucket(self.counters)
        for level in self._levels():
            total.absorb(level.retired)
            for bucket in level._ring:
                if bucket.round != _NEVER:
                    total.absorb(bucket)
        return total

    def _levels(self) -> list[TimeWheel]:
        levels: list[TimeWheel] = []
        wheel: TimeWheel | None = self
        while wheel is not None:
            levels.append(wheel)
            wheel = wheel.coarse
        return levels

    def _owner(self, window: float) -> TimeWheel | None:
        """The wheel whose buckets measure *window*: the finest one it fits in."""
        wheel: TimeWheel | None = self
        while wheel is not None and window > wheel.seconds:
            wheel = wheel.coarse
        return wheel


def minute_wheel(counters: int, clock: Clock = monotonic) -> TimeWheel:
    """The default pair: 60 x 1 s buckets (4 spare) feeding 60 x 1 min buckets (2 spare)."""
    coarse = TimeWheel(counters, width=60.0, span=60, spare=2, clock=clock)
    return TimeWheel(counters, width=1.0, span=60, spare=4, clock=clock, coarse=coarse)
