"""What a key-run gate keeps in its worker: the runs it holds a key for (their holds renewed
every third of the lease, stepped aside from when a run leaves the worker) and the messages
it holds waiting (unacked), by bucket; and ``inspect stats``' figures of both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..admission.gate import Ticket
from ..admission.notices import ALL, Bucket
from .runs import KeyHolding, renew_due

__all__ = ["Held", "RunHolds", "Waiting", "per_task"]


@dataclass
class Held(KeyHolding):
    """A hold of this worker: the run (or a waiting message) of *bucket* under *holder*; a
    waiting message also knows, when last asked, the seconds until its wait ends (*due*)."""

    due: float = 0.0


#: ``step_aside(bucket, id, holder, seconds, lease)`` and ``renew(bucket, ids, holder, lease)``
StepAside = Callable[[Bucket, str, str, float, float], Any]
Renew = Callable[[Bucket, list[str], str, float], Any]


class RunHolds:
    """The runs this worker holds a key for, by ``id(request)``."""

    def __init__(self, step_aside: StepAside, renew: Renew, policy: str) -> None:
        self._step_aside, self._renew, self.policy = step_aside, renew, policy
        self.runs: dict[int, tuple[Ticket, Held]] = {}
        self.lost = 0

    def add(self, ticket: Ticket, holding: Held) -> None:
        self.runs[id(ticket.request)] = (ticket, holding)

    def get(self, ticket: Ticket) -> Held | None:
        found = self.runs.get(id(ticket.request))
        return found[1] if found is not None else None

    def pop(self, ticket: Ticket) -> Held | None:
        found = self.runs.pop(id(ticket.request), None)
        return found[1] if found is not None else None

    def step_aside(self, ticket: Ticket, holding: Held, seconds: float) -> None:
        """The run leaves this worker (a retry, parked, a lost connection): its key stays
        held *seconds* more for whoever runs it next."""
        self._step_aside(holding.bucket, ticket.request.id, holding.holder, seconds,
                         holding.lease)  # fmt: skip

    def renew(self, now: float) -> None:
        """Renew the holds due; a hold that ran out before renewal is lost (logged)."""
        self.lost += renew_due(self.runs.values(), now, self._renew, self.policy)

    def drop_unadmitted(self, in_pool: Callable[[Any], bool]) -> None:
        """The connection is lost: runs that had not reached the pool keep their hold for
        whoever receives them next; those running keep theirs until they end."""
        for key, (ticket, holding) in list(self.runs.items()):
            if not in_pool(ticket.request):
                del self.runs[key]
                self.step_aside(ticket, holding, 0.0)

    def running(self) -> Iterable[Held]:
        return (holding for _, holding in self.runs.values())


class Waiting:
    """The messages a gate holds waiting (unacked), by bucket, each with its :class:`Held`."""

    def __init__(self) -> None:
        self.buckets: dict[Bucket, list[tuple[Ticket, Held]]] = {}

    def __len__(self) -> int:
        return sum(len(waits) for waits in self.buckets.values())

    def __contains__(self, bucket: Bucket) -> bool:
        return bucket in self.buckets

    def add(self, ticket: Ticket, holding: Held) -> None:
        self.buckets.setdefault(holding.bucket, []).append((ticket, holding))

    def remove(self, bucket: Bucket, ticket: Ticket) -> None:
        waiting = [w for w in self.buckets.get(bucket, []) if w[0] is not ticket]
        if waiting:
            self.buckets[bucket] = waiting
        else:
            self.buckets.pop(bucket, None)

    def named(self, bucket: Bucket) -> list[tuple[Bucket, Ticket, Held]]:
        """The messages waiting in *bucket* (in every bucket for :data:`ALL`)."""
        buckets = list(self.buckets) if bucket == ALL else [bucket]
        return [(one, t, h) for one in buckets for t, h in self.buckets.get(one, ())]

    def due(self, now: float) -> list[Bucket]:
        """The buckets with a message due to ask again at *now*."""
        return [b for b, waits in self.buckets.items() if any(now >= h.next_ask for _, h in waits)]

    def next_due(self) -> float | None:
        """When the first waiting message asks again, or ``None``."""
        return min((h.next_ask for w in self.buckets.values() for _, h in w), default=None)

    def held_since(self, before: float) -> list[tuple[Bucket, Ticket, Held]]:
        """The messages that started to wait before *before*."""
        return [(b, t, h) for b, t, h in self.named(ALL) if h.since < before]

    def take_all(self) -> list[tuple[Bucket, Ticket, Held]]:
        """Every waiting message, taken out."""
        everything = self.named(ALL)
        self.buckets.clear()
        return everything


def per_task(specs: Mapping[str, Any], runs: Iterable[Held],
             waiting: Waiting) -> dict[str, dict[str, Any]]:  # fmt: skip
    """``inspect stats``' figures per task: its spec, and its messages running and waiting
    in this worker."""
    tasks = {name: {**spec.describe(), "running": 0, "waiting": 0}
             for name, spec in specs.items()}  # fmt: skip
    for holding in runs:
        tasks[holding.bucket[0]]["running"] += 1
    for bucket, _, _ in waiting.named(ALL):
        tasks[bucket[0]]["waiting"] += 1
    return tasks
