"""What the debounce gate keeps about each hold of its worker (the messages it holds
waiting, by bucket), its runs' renewals and its figures; the rest of a key's runs is
shared with coalescing (:mod:`celery_extras.admission.key_runs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..admission.gate import Ticket
from ..admission.key_runs import KeyHolding, renew_due
from ..admission.notices import ALL, Bucket
from .holds import DebounceHolds

__all__ = ["DebounceHolding", "Waiting", "per_task", "renew_runs"]


@dataclass
class DebounceHolding(KeyHolding):
    """A hold of this worker: the run (or waiting message) of *bucket* under *holder*; a
    waiting message also knows its wait when last asked."""

    waits: float = 0.0


class Waiting:
    """The messages a gate holds waiting (unacked), by bucket, each with its
    :class:`DebounceHolding`."""

    def __init__(self) -> None:
        self.buckets: dict[Bucket, list[tuple[Ticket, DebounceHolding]]] = {}

    def __len__(self) -> int:
        return sum(len(waits) for waits in self.buckets.values())

    def __contains__(self, bucket: Bucket) -> bool:
        return bucket in self.buckets

    def add(self, ticket: Ticket, holding: DebounceHolding) -> None:
        self.buckets.setdefault(holding.bucket, []).append((ticket, holding))

    def remove(self, bucket: Bucket, ticket: Ticket) -> None:
        waiting = [w for w in self.buckets.get(bucket, []) if w[0] is not ticket]
        if waiting:
            self.buckets[bucket] = waiting
        else:
            self.buckets.pop(bucket, None)

    def named(self, bucket: Bucket) -> list[tuple[Bucket, Ticket, DebounceHolding]]:
        """The messages waiting in *bucket* (in every bucket for :data:`ALL`)."""
        buckets = list(self.buckets) if bucket == ALL else [bucket]
        return [(one, t, h) for one in buckets for t, h in self.buckets.get(one, ())]

    def due(self, now: float) -> list[Bucket]:
        """The buckets with a message due to ask again at *now*."""
        return [b for b, waits in self.buckets.items() if any(now >= h.next_ask for _, h in waits)]

    def next_due(self) -> float | None:
        """When the first waiting message asks again, or ``None``."""
        return min((h.next_ask for w in self.buckets.values() for _, h in w), default=None)

    def held_since(self, before: float) -> list[tuple[Bucket, Ticket, DebounceHolding]]:
        """The messages that started to wait before *before*."""
        return [(b, t, h) for b, t, h in self.named(ALL) if h.since < before]

    def take_all(self) -> list[tuple[Bucket, Ticket, DebounceHolding]]:
        """Every waiting message, taken out."""
        everything = self.named(ALL)
        self.buckets.clear()
        return everything


def renew_runs(holds: DebounceHolds, holdings: Iterable[tuple[Ticket, DebounceHolding]],
               now: float) -> int:  # fmt: skip
    """Renew the runs whose hold is due; the number whose hold had run out."""

    def renew(bucket: Bucket, ids: list[str], holder: str, lease: float) -> list[str] | None:
        return holds.call(lambda h: h.renew(bucket, ids, holder, lease))

    return renew_due(holdings, now, renew, "debounce")


def per_task(specs: Mapping[str, Any], holdings: Iterable[tuple[Ticket, DebounceHolding]],
             waiting: Waiting) -> dict[str, dict[str, Any]]:  # fmt: skip
    """``inspect stats``' figures per task: its spec, and its messages running and waiting
    in this worker."""
    tasks = {name: {**spec.describe(), "running": 0, "waiting": 0}
             for name, spec in specs.items()}  # fmt: skip
    for _, holding in holdings:
        tasks[holding.bucket[0]]["running"] += 1
    for bucket, _, _ in waiting.named(ALL):
        tasks[bucket[0]]["waiting"] += 1
    return tasks
