"""Requests waiting for a pool process, in priority order: a heap, FIFO within a level, aging.

Pure (no Celery import, an injected clock). A message's *level* is its rank, 0 first, on
every broker (:func:`redis_level`, :func:`amqp_level` turn a message's ``priority`` into
one). Without aging the heap is keyed by ``(level, arrival number)``: the lowest level
first, and within a level the first to arrive. With aging every *aging* seconds of wait
count as one level: the key is ``level * aging + arrival time``, so a message that has waited
``k * aging`` seconds ranks with one ``k`` levels better that arrives now, and ahead of it
(it came first). The key of a waiting message never changes, so adding and taking are
``O(log n)`` and nothing is ever re-sorted.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..clock import monotonic

__all__ = ["LEVELS", "PriorityBuffer", "Waiting", "amqp_level", "redis_level"]

T = TypeVar("T")

#: Distinct levels on Redis (kombu clamps a message's priority to 0-9).
LEVELS = 10


def redis_level(priority: object) -> int:
    """Rank of a message on Redis: its priority clamped to 0-9, 0 first (kombu's order);
    none (or not a number) is 0, as kombu files it."""
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        return 0
    return max(0, min(LEVELS - 1, int(priority)))


def amqp_level(priority: object, max_priority: int) -> int:
    """Rank of a message on a RabbitMQ queue with ``x-max-priority`` *max_priority*: the
    highest priority first (RabbitMQ's order), none as 0 (the lowest), above the maximum
    as the maximum."""
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        priority = 0
    return max_priority - max(0, min(max_priority, int(priority)))


@dataclass(slots=True)
class Waiting(Generic[T]):
    """One waiting item: its key (the heap's order, then its arrival number *seq*)."""

    key: float
    seq: int
    item: T
    level: int
    queue: str
    since: float


class PriorityBuffer(Generic[T]):
    """Items waiting for a pool process; :meth:`pop` gives the one to run next."""

    def __init__(self, aging: float | None = None,
                 clock: Callable[[], float] = monotonic) -> None:  # fmt: skip
        if aging is not None and aging <= 0:
            raise ValueError(f"aging must be > 0 seconds, got {aging!r}")
        self.aging = aging
        self.clock = clock
        self._heap: list[tuple[float, int, Waiting[T]]] = []  # tuples: compared in C
        self._seq = itertools.count()
        self._counts: dict[tuple[str, int], int] = {}

    def push(self, item: T, level: int, queue: str = "") -> Waiting[T]:
        """Add *item* at *level* (0 first) of *queue*; return its entry."""
        now = self.clock()
        key = float(level) if self.aging is None else level * self.aging + now
        entry = Waiting(key, next(self._seq), item, level, queue, now)
        heapq.heappush(self._heap, (key, entry.seq, entry))
        self._counts[queue, level] = self._counts.get((queue, level), 0) + 1
        return entry

    def pop(self) -> Waiting[T]:
        """Take the entry to run next; :class:`IndexError` when none waits."""
        entry = heapq.heappop(self._heap)[2]
        self._count_out(entry)
        return entry

    def peek(self) -> Waiting[T]:
        """The entry :meth:`pop` would take, left in place; :class:`IndexError` when none."""
        return self._heap[0][2]

    def clear(self) -> list[Waiting[T]]:
        """Take every entry out, best first."""
        taken = [entry for _, _, entry in sorted(self._heap)]
        self._heap.clear()
        self._counts.clear()
        return taken

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Waiting[T]]:
        """The entries, in no particular order."""
        return iter([entry for _, _, entry in self._heap])

    def effective_level(self, entry: Waiting[T]) -> float:
        """The level *entry* ranks at now (its level, less one per *aging* seconds waited,
        not below 0)."""
        if self.aging is None:
            return float(entry.level)
        return max(0.0, entry.level - (self.clock() - entry.since) / self.aging)

    def counts(self) -> dict[str, dict[int, int]]:
        """Waiting items per queue, per level: ``{queue: {level: count}}``."""
        out: dict[str, dict[int, int]] = {}
        for (queue, level), count in sorted(self._counts.items()):
            out.setdefault(queue, {})[level] = count
        return out

    def oldest_wait(self) -> float:
        """Seconds the longest-waiting item has waited (0 when none waits)."""
        if not self._heap:
            return 0.0
        return max(0.0, self.clock() - min(e.since for _, _, e in self._heap))

    def _count_out(self, entry: Waiting[T]) -> None:
        slot = (entry.queue, entry.level)
        left = self._counts.get(slot, 0) - 1
        if left > 0:
            self._counts[slot] = left
        else:
            self._counts.pop(slot, None)
