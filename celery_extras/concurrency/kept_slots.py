"""Global slots a worker keeps for its next request of a bucket, instead of freeing them.

A task under a global cap that does not bind pays two store calls for its slot: a take
as it arrives and a release as it ends. While the store's last answer about a bucket
(at most :data:`FRESH` seconds old) said that at most a quarter of its cap was held, a
slot a request of this worker frees is kept here, and the bucket's next arrival in this
worker takes it without asking. The store still counts a kept slot as held, so no cap is
ever exceeded; and none is kept while another worker could be short of one (three
quarters of the cap were free). Kept slots whose word went stale are handed back to be
freed. No Celery import; an injectable clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .slot_table import Bucket

__all__ = ["FRESH", "MIN_CAP", "MOST_KEPT", "ROOMY", "KeptSlots"]

#: A bucket is roomy while at most 1/ROOMY of its cap is held.
ROOMY = 4
#: Smaller caps keep no slot: each take and release of theirs asks the store.
MIN_CAP = 8
#: Seconds the store's word that a bucket is roomy is trusted.
FRESH = 0.1
#: Slots kept at most per bucket.
MOST_KEPT = 16

S = TypeVar("S")


class KeptSlots(Generic[S]):
    """Slots (any object) kept per bucket, each usable until a time of the clock (its lease
    is renewed then: a slot is kept only while no renewal is due)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._roomy: dict[Bucket, float] = {}  # bucket -> until when its word holds
        self._kept: dict[Bucket, list[tuple[S, float]]] = {}
        self.reused = 0  # slots taken again unasked, since the start

    def heard(self, bucket: Bucket, held: int, cap: int) -> None:
        """The store gave a slot of *bucket*, which now has *held* holders of *cap*."""
        if cap >= MIN_CAP and held * ROOMY <= cap:
            self._roomy[bucket] = self.clock() + FRESH
        else:
            self._roomy.pop(bucket, None)

    def can_keep(self, bucket: Bucket, until: float) -> bool:
        """Whether a slot of *bucket*, usable until *until*, would be kept."""
        now = self.clock()
        return (
            self._roomy.get(bucket, now) > now
            and until > now
            and len(self._kept.get(bucket, ())) < MOST_KEPT
        )

    def keep(self, bucket: Bucket, slot: S, until: float) -> bool:
        """Keep *slot* of *bucket* (usable until *until*); ``False`` when it must be freed."""
        if not self.can_keep(bucket, until):
            return False
        self._kept.setdefault(bucket, []).append((slot, until))
        return True

    def take(self, bucket: Bucket) -> S | None:
        """A kept slot of *bucket* for a request arriving now, or ``None`` (ask the store)."""
        kept = self._kept.get(bucket)
        now = self.clock()
        if not kept or self._roomy.get(bucket, now) <= now:
            return None
        slot, until = kept[-1]
        if until <= now:
            return None  # due for renewal: stale() hands it back, the store is asked
        kept.pop()
        if not kept:
            del self._kept[bucket]
        self.reused += 1
        return slot

    def stale(self) -> list[S]:
        """Take out the kept slots to free: of buckets whose word went stale, or due for
        renewal."""
        now = self.clock()
        out: list[S] = []
        for bucket, kept in list(self._kept.items()):
            roomy = self._roomy.get(bucket, now) > now
            usable = [(slot, until) for slot, until in kept if roomy and until > now]
            out += [slot for slot, until in kept if not (roomy and until > now)]
            if usable:
                self._kept[bucket] = usable
            else:
                del self._kept[bucket]
        for bucket in [b for b, until in self._roomy.items() if until <= now]:
            del self._roomy[bucket]
        return out

    def drain(self) -> list[S]:
        """Take out every kept slot (the worker stops)."""
        out = [slot for kept in self._kept.values() for slot, _ in kept]
        self._kept.clear()
        self._roomy.clear()
        return out

    def info(self) -> dict[str, int]:
        return {"kept": len(self), "reused": self.reused}

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._kept.values())
