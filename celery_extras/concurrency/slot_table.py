"""Concurrency slots, pure: leased holders per bucket and FIFO waiters per bucket.

No Celery import, an injectable clock. :class:`SlotTable` keeps the same rules as
the Redis scripts of :mod:`.slot_store` (a holder counts until it is released or
its lease runs out; at most *cap* at once), in one process: it is what
``scope="worker"`` uses, and what global slots fall back to while the store is
down. :class:`WaitQueues` holds a worker's waiting tasks, first come first
served per bucket; a bucket with nobody waiting and nobody holding takes no
memory at all, so 10,000 idle keys cost nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

from ..clock import monotonic

__all__ = ["Bucket", "SlotTable", "WaitQueues"]

#: A slot bucket: ``(task name, key)``; key ``""`` is the task's shared bucket.
Bucket = tuple[str, str]

T = TypeVar("T")


class SlotTable:
    """Holders with leases, per bucket, in one process."""

    def __init__(self, clock: Callable[[], float] = monotonic) -> None:
        self.clock = clock
        self._held: dict[Bucket, dict[Hashable, float]] = {}  # bucket -> {holder: expiry}

    def _live(self, bucket: Bucket) -> dict[Hashable, float]:
        holders = self._held.get(bucket)
        if holders is None:
            return {}
        now = self.clock()
        for holder in [h for h, until in holders.items() if until <= now]:
            del holders[holder]  # lease ran out: the slot is free again
        if not holders:
            del self._held[bucket]
            return {}
        return holders

    def acquire(self, bucket: Bucket, holder: Hashable, cap: int, lease: float) -> float:
        """Take a slot of *bucket* for *holder*: ``0.0`` when taken, else the seconds until
        the first lease runs out (when a slot frees at the latest)."""
        holders = self._live(bucket)
        if holder in holders or len(holders) < cap:
            self._held.setdefault(bucket, holders)[holder] = self.clock() + lease
            return 0.0
        return max(min(holders.values()) - self.clock(), 0.0)

    def renew(self, bucket: Bucket, holder: Hashable, lease: float) -> bool:
        """Extend *holder*'s lease; ``False`` when it had run out (the slot was reclaimed)."""
        holders = self._live(bucket)
        if holder not in holders:
            return False
        holders[holder] = self.clock() + lease
        return True

    def release(self, bucket: Bucket, holder: Hashable) -> bool:
        """Free *holder*'s slot; ``False`` when it held none (already released or expired)."""
        holders = self._live(bucket)
        found = holders.pop(holder, None) is not None
        if not holders:
            self._held.pop(bucket, None)
        return found

    def holding(self, bucket: Bucket) -> int:
        return len(self._live(bucket))

    def buckets(self) -> int:
        """Buckets taking memory (some holder in them)."""
        return len(self._held)


class WaitQueues(Generic[T]):
    """Waiting items per bucket, oldest first; empty buckets are dropped at once."""

    def __init__(self) -> None:
        self._queues: dict[Bucket, deque[T]] = {}
        self._count = 0

    def push(self, bucket: Bucket, item: T) -> None:
        self._queues.setdefault(bucket, deque()).append(item)
        self._count += 1

    def push_front(self, bucket: Bucket, item: T) -> None:
        """Put *item* back at the head (it was taken but could not go)."""
        self._queues.setdefault(bucket, deque()).appendleft(item)
        self._count += 1

    def pop(self, bucket: Bucket) -> T | None:
        queue = self._queues.get(bucket)
        if not queue:
            return None
        item = queue.popleft()
        self._count -= 1
        if not queue:
            del self._queues[bucket]
        return item

    def remove(self, bucket: Bucket, item: T) -> bool:
        queue = self._queues.get(bucket)
        if not queue or item not in queue:
            return False
        queue.remove(item)
        self._count -= 1
        if not queue:
            del self._queues[bucket]
        return True

    def waiting(self, bucket: Bucket) -> int:
        queue = self._queues.get(bucket)
        return len(queue) if queue else 0

    def buckets(self) -> list[Bucket]:
        return list(self._queues)

    def drain(self) -> Iterator[tuple[Bucket, T]]:
        """Every waiting item, emptying the queues."""
        queues, self._queues, self._count = self._queues, {}, 0
        for bucket, queue in queues.items():
            for item in queue:
                yield bucket, item

    def __len__(self) -> int:
        return self._count
