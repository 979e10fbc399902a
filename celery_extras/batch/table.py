"""Which calls wait for a batch, and when a batch is due: no Celery import, an injected clock.

Calls of one task and key gather in one open batch; it is due when it holds ``size`` calls
or ``wait`` seconds after its first call, whichever comes first. A due batch leaves the
table whole: the next call of the key opens a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..clock import monotonic

__all__ = ["Batch", "BatchTable"]

T = TypeVar("T")


@dataclass
class Batch(Generic[T]):
    """The calls gathered for one bucket (task and key), from *opened* on (the clock's)."""

    bucket: Hashable
    opened: float
    due: float
    items: list[T] = field(default_factory=list)


class BatchTable(Generic[T]):
    """The open batches of one worker, by bucket."""

    def __init__(self, clock: Callable[[], float] = monotonic) -> None:
        self.clock = clock
        self.open: dict[Hashable, Batch[T]] = {}

    def add(self, bucket: Hashable, item: T, size: int, wait: float) -> Batch[T] | None:
        """Add *item* to *bucket*'s open batch (opened now when there is none); the batch,
        taken out of the table, when it is full."""
        batch = self.open.get(bucket)
        if batch is None:
            now = self.clock()
            batch = self.open[bucket] = Batch(bucket, now, now + wait)
        batch.items.append(item)
        if len(batch.items) >= size:
            return self.open.pop(bucket)
        return None

    def take_due(self) -> list[Batch[T]]:
        """The batches whose wait has passed, taken out of the table, oldest first."""
        now = self.clock()
        due = sorted((b for b in self.open.values() if b.due <= now), key=lambda b: b.due)
        for batch in due:
            del self.open[batch.bucket]
        return due

    def take_all(self) -> list[Batch[T]]:
        """Every open batch, taken out of the table (the worker stops)."""
        batches, self.open = list(self.open.values()), {}
        return batches

    def next_due(self) -> float | None:
        """When the next open batch is due (the clock's), or ``None``."""
        return min((b.due for b in self.open.values()), default=None)

    def waiting(self) -> int:
        return sum(len(b.items) for b in self.open.values())
