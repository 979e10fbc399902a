"""A fixed log-scale histogram of durations: bounded memory, percentiles within 2.2 %.

Each octave (a doubling of the value) is split into :data:`PER_OCTAVE` buckets,
from :data:`LOWEST` (about 1 us) to :data:`HIGHEST` (about 4.5 h); values outside
are clamped to the end buckets. A histogram stores only the buckets it has seen
(at most :data:`BUCKETS` of them), so a time wheel can keep one per slot without
unbounded lists, and merging two is a dict update.
"""

from __future__ import annotations

import math

__all__ = [
    "BUCKETS",
    "HIGHEST",
    "LOWEST",
    "PER_OCTAVE",
    "SCALE",
    "Histogram",
    "bucket_of",
    "upper_bound",
]

PER_OCTAVE = 16
_LOW_EXP = -20  # 2**-20 s ~ 0.95 us
_HIGH_EXP = 14  # 2**14 s ~ 4.5 h
LOWEST = 2.0**_LOW_EXP
HIGHEST = 2.0**_HIGH_EXP
_OFFSET = -_LOW_EXP * PER_OCTAVE
BUCKETS = (_HIGH_EXP - _LOW_EXP) * PER_OCTAVE + 1
#: What a bucket index means, as the ``worker-throughput`` event states it.
SCALE = {"per_octave": PER_OCTAVE, "low_exp": _LOW_EXP, "high_exp": _HIGH_EXP}


def bucket_of(value: float) -> int:
    """The bucket index of *value* (seconds), clamped to ``[0, BUCKETS - 1]``."""
    if value <= LOWEST:
        return 0
    if value >= HIGHEST:
        return BUCKETS - 1
    return math.floor(math.log2(value) * PER_OCTAVE) + _OFFSET


def upper_bound(
    index: int, per_octave: int = PER_OCTAVE, low_exp: int = _LOW_EXP, high_exp: int = _HIGH_EXP
) -> float:
    """The (exclusive) upper bound in seconds of bucket *index*; ``inf`` for the last one.

    The scale's parameters default to this module's, and come from an event's
    ``runtime_scale`` on the monitor side.
    """
    if index >= (high_exp - low_exp) * per_octave:
        return math.inf
    return float(2.0 ** (low_exp + (index + 1) / per_octave))


def _midpoint(index: int) -> float:
    """The geometric middle of bucket *index*: at most 2.2 % from any value in it."""
    return float(2.0 ** ((index - _OFFSET + 0.5) / PER_OCTAVE))


class Histogram:
    """Count, sum, min, max and log-scale bucket counts of the values added."""

    __slots__ = ("buckets", "count", "high", "low", "total")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0.0
        self.high = 0.0
        self.low = math.inf

    def add(self, value: float) -> None:
        index = bucket_of(value)
        buckets = self.buckets
        buckets[index] = buckets.get(index, 0) + 1
        self.count += 1
        self.total += value
        if value > self.high:
            self.high = value
        if value < self.low:
            self.low = value

    def merge(self, other: Histogram) -> None:
        """Add every value of *other* to this histogram."""
        buckets = self.buckets
        for index, n in other.buckets.items():
            buckets[index] = buckets.get(index, 0) + n
        self.count += other.count
        self.total += other.total
        self.high = max(self.high, other.high)
        self.low = min(self.low, other.low)

    def clear(self) -> None:
        self.buckets.clear()
        self.count = 0
        self.total = 0.0
        self.high = 0.0
        self.low = math.inf

    def percentile(self, p: float) -> float | None:
        """The nearest-rank *p*-th percentile (``0 < p <= 100``), ``None`` when empty.

        The exact value lies in the bucket returned, so the answer is within one
        half-bucket (2.2 %) of it; it is clamped to the smallest and largest value seen,
        which are also the answers for the two end buckets (values out of range).
        """
        if not 0 < p <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {p!r}")
        if self.count == 0:
            return None
        rank = max(1, math.ceil(p / 100.0 * self.count))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                if index == BUCKETS - 1 or rank == self.count:
                    return self.high
                if index == 0:
                    return self.low
                return min(max(_midpoint(index), self.low), self.high)
        return self.high  # unreachable while counts add up; kept for safety
