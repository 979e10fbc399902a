"""Several token buckets admitting one call together: all of them, at the latest of their times.

A call under several limits runs only when every bucket admits its tokens. When all
admit it now, all are taken at once (all or nothing). Otherwise only the bucket that
makes it wait longest (the binding one) books its slot; the others keep their tokens
for other calls and are asked again when that slot comes. So a per-customer limit
holding a call back does not use up the global limit above it. If, at that slot,
another bucket still makes it wait (others took it meanwhile), the call keeps the
token it holds and books that bucket's slot: a call waits at most one slot of each
of its limits, and no token is ever handed out twice or lost. The same rule runs in
Redis for global buckets (``scripts/bucket_acquire.lua``); the caller
(:class:`~.planner.LimitPlanner`) keeps what a call holds. No Celery import; the
buckets carry the clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .token_bucket import TokenBucket

__all__ = ["Admission", "admit_all"]


@dataclass(frozen=True)
class Admission:
    """Seconds to wait (0: every bucket was taken) and the index of the bucket booked for
    that wait (``None``: none, when *floor* was the longest or the wait too long)."""

    wait: float
    booked: int | None


def admit_all(
    takes: Sequence[tuple[TokenBucket, int]], floor: float = 0.0, max_wait: float = math.inf
) -> Admission:
    """Admit one call taking ``tokens`` of each ``(bucket, tokens)`` in *takes*.

    *floor* is a wait asked by limits elsewhere (the store's); a wait beyond *max_wait*
    books nothing, so the caller waits that long and asks again.
    """
    waits = [bucket.expected_time(tokens) if tokens else 0.0 for bucket, tokens in takes]
    wait, booked = floor, None
    for i, own in enumerate(waits):
        if own > 0 and own >= wait:
            wait, booked = own, i
    if wait <= 0:
        for bucket, tokens in takes:
            if tokens:
                bucket.reserve(tokens)
        return Admission(0.0, None)
    if wait > max_wait or booked is None:
        return Admission(wait, None)
    bucket, tokens = takes[booked]
    bucket.reserve(tokens)
    return Admission(wait, booked)
