"""Several token buckets admitting one call together: all of them, at the latest of their times.

A call under several limits runs only when every bucket admits its tokens. When all
admit it now, all are taken at once (all or nothing). Otherwise:

* a *narrow* bucket (one shared only by the call's worker or key) books its own slot at
  once, so the calls of one worker or key queue in order;
* a *broad* bucket (shared by every call of the task) books its slot only when it is the
  one that makes the call wait longest (binding); otherwise it is asked again when the
  call's time comes, so it loses no capacity to a call another limit holds back (a
  per-customer limit holding one customer's backlog leaves the global limit to the
  others).

A call thus never runs before every bucket has handed it its tokens, no token is handed
out twice, and one booked and then unused is never given to another call (the safe
side). The same rule runs in Redis for global buckets (``scripts/bucket_acquire.lua``);
:class:`~.planner.LimitPlanner` asks the rest again when a held call's time comes. No
Celery import; the buckets carry the clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .token_bucket import TokenBucket

__all__ = ["Admission", "admit_all"]


@dataclass(frozen=True)
class Admission:
    """Seconds to wait (0: every bucket was taken), the index of the bucket that makes the
    call wait that long (``None``: the floor does, or none), and which buckets booked."""

    wait: float
    binding: int | None
    booked: tuple[bool, ...]


def admit_all(
    takes: Sequence[tuple[TokenBucket, int, bool]],
    floor: float = 0.0,
    max_wait: float = math.inf,
) -> Admission:
    """Admit one call taking ``tokens`` of each ``(bucket, tokens, narrow)`` in *takes*.

    *floor* is a wait asked by limits elsewhere; a wait beyond *max_wait* books nothing,
    so the caller waits that long and asks again.
    """
    waits = [bucket.expected_time(tokens) if tokens else 0.0 for bucket, tokens, _ in takes]
    wait, binding = floor, None
    for i, own in enumerate(waits):
        if own > 0 and own >= wait:
            wait, binding = own, i
    booked = [False] * len(takes)
    if wait <= max_wait:
        for i, (bucket, tokens, narrow) in enumerate(takes):
            if tokens and waits[i] <= max_wait and (wait <= 0 or narrow or i == binding):
                bucket.reserve(tokens)
                booked[i] = True
    return Admission(max(wait, 0.0), binding, tuple(booked))
