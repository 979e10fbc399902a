"""The token buckets a worker keeps itself: worker-scope limits, the fallback buckets of
global ones while the store is away, and the schedules of parked returns; and what the
fallback buckets handed out (their debt to the store's schedule). No Celery import."""

from __future__ import annotations

from collections.abc import Callable

from ..bounds import MAX_WAIT
from .token_bucket import TokenBucket

__all__ = ["MAX_LOCAL_BUCKETS", "LocalBuckets"]

#: Most buckets (and remembered slots) kept; idle ones go first.
MAX_LOCAL_BUCKETS = 4096


class LocalBuckets:
    """A worker's own buckets by ``(bucket name, key)``: a limit's id, ``fallback:<id>`` (its
    stand-in while the store is away) or ``parked:<id>`` (when its parked calls come back)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.buckets: dict[tuple[str, str], TokenBucket] = {}
        #: Latest global slot this worker booked per bucket, and the span (burst x interval)
        #: it covers: a fallback bucket starts after it, so an outage adds no second burst.
        self.last_slot: dict[tuple[str, str], tuple[float, float]] = {}
        #: whether a fallback bucket was ever made (until then no admission looks for one)
        self.fallen_back = False

    def get(self, bucket_name: str, key: str, rate: float, burst: int) -> TokenBucket:
        """The bucket *bucket_name* of *key*, made at *rate* and *burst* when new."""
        bucket = self.buckets.get((bucket_name, key))
        if bucket is None:
            if len(self.buckets) >= MAX_LOCAL_BUCKETS:
                for k in [k for k, b in self.buckets.items() if b.idle()]:
                    del self.buckets[k]
            bucket = self.buckets[(bucket_name, key)] = TokenBucket(rate, burst, self.clock)
        return bucket

    def retune(self, limit: str, rate_of: Callable[[str], tuple[float, int]]) -> None:
        """Give every bucket of *limit* (its own, fallback and parked) the rate and burst
        ``rate_of(key)`` says."""
        for (bucket_name, key), bucket in self.buckets.items():
            if bucket_name in (limit, f"fallback:{limit}", f"parked:{limit}"):
                bucket.set_rate(*rate_of(key))

    def fallback(self, limit: str, key: str, rate: float, burst: int) -> TokenBucket:
        """The stand-in bucket of global *limit*, starting after the last slot the store
        gave this worker."""
        self.fallen_back = True
        bucket = self.get(f"fallback:{limit}", key, rate, burst)
        last = self.last_slot.get((limit, key))
        if last is not None:
            bucket.charge_until(last[0])
        return bucket

    def fell_back(self, limit: str, key: str) -> bool:
        """Whether a fallback bucket of *limit* and *key* handed out slots in an outage (its
        debt may make a task the store admits wait: :meth:`after_fallback`)."""
        return self.fallen_back and (f"fallback:{limit}", key) in self.buckets

    def after_fallback(self, limit: str, key: str, wait: float) -> float:
        """*wait*, or longer so the slot comes after those the fallback bucket handed out
        during an outage: a worker adds no global burst on top of its local debt."""
        fallback = self.buckets.get((f"fallback:{limit}", key)) if self.fallen_back else None
        if fallback is None:
            return wait
        now = self.clock()
        after = min(MAX_WAIT, fallback.booked_until() + fallback.interval - now)
        if after <= wait:
            return wait  # the store's own schedule has caught up
        fallback.charge_until(now + after)  # the next one comes an interval later
        return after

    def booked(self, bucket: tuple[str, str], when: float, span: float) -> None:
        """The store gave this worker a slot of global *bucket* at *when*."""
        if len(self.last_slot) >= MAX_LOCAL_BUCKETS:
            now = self.clock()
            for k in [k for k, (at, s) in self.last_slot.items() if at + s <= now]:
                del self.last_slot[k]
        last = self.last_slot.get(bucket)
        if last is None or when > last[0]:
            self.last_slot[bucket] = (when, span)
