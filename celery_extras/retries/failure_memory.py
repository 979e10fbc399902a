"""Per-item failure counts, the memory of the retry limiters, behind one small interface.

A limiter never owns a dict of failures directly: it asks a :class:`Counts`.
In unit tests and plain Python that is :class:`MemoryCounts`; in a worker it is
a Redis-backed one, so every worker sees (and forgets) the same counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["Counts", "CountsFactory", "MemoryCounts"]


class Counts(Protocol):
    """How many times each item has failed."""

    def incr(self, item: str) -> int:
        """Count one more failure of *item*; return the new count."""
        ...

    def get(self, item: str) -> int:
        """Failures of *item* so far (0 when unknown)."""
        ...

    def forget(self, item: str) -> None:
        """Drop *item*'s failures (it succeeded, or was given up)."""
        ...


#: Builds the :class:`Counts` of one limiter inside a composite, given its path (``"p.0"``).
CountsFactory = Callable[[str], Counts]


class MemoryCounts:
    """Failure counts in a dict: one process, no expiry."""

    def __init__(self) -> None:
        self.failures: dict[str, int] = {}

    def incr(self, item: str) -> int:
        count = self.failures.get(item, 0) + 1
        self.failures[item] = count
        return count

    def get(self, item: str) -> int:
        return self.failures.get(item, 0)

    def forget(self, item: str) -> None:
        self.failures.pop(item, None)
