"""What the debounce gate keeps about each hold of its worker (the messages it holds
waiting, by bucket), and how a run's end reaches what it covered: the outcome the worker
saw, the covered messages, a parked message hurried.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery import states
from celery.exceptions import TaskRevokedError

from .. import compat
from ..admission.covered import CoveredMessage, Outcome, decode_context
from ..admission.gate import Ticket
from ..admission.notices import ALL, Bucket
from ..delay.gate import DELAY_ATTR
from .holds import DebounceHolds
from .table import DebounceFinished

__all__ = [
    "DebounceHolding",
    "Waiting",
    "covered_messages",
    "hurry",
    "known_outcome",
    "per_task",
    "renew_runs",
    "revoked_outcome",
]

logger = logging.getLogger("celery_extras.debounce")


@dataclass
class DebounceHolding:
    """A hold of this worker: the run (or waiting message) of *bucket* under *holder*."""

    bucket: Bucket
    holder: str
    lease: float
    #: when it was last asked for (or renewed), and when to ask again (the gate's clock)
    asked: float
    next_ask: float = 0.0
    #: a waiting message: when it started to wait here, and its wait when last asked
    since: float = 0.0
    waits: float = 0.0
    #: a run whose hold ran out before renewal (another run of its key may have started)
    lost: bool = False


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


def revoked_outcome(run_id: str) -> Outcome:
    """The outcome of a run Celery discarded before it ran."""
    return Outcome(states.REVOKED, TaskRevokedError("revoked"), None, run_id)


def known_outcome(ticket: Ticket) -> Outcome:
    """The outcome of *ticket*'s run as the worker saw it (for a task that stores no
    result): its exception, else success (its return value stays in its pool process)."""
    run_id = ticket.request.id
    if isinstance(ticket.outcome, BaseException):
        return Outcome(states.FAILURE, ticket.outcome, None, run_id)
    if ticket.outcome is None and run_id in compat.worker_revoked():
        return revoked_outcome(run_id)
    if ticket.outcome is None:
        return Outcome(states.FAILURE, RuntimeError("the covering run ended unseen"), None, run_id)
    return Outcome(states.SUCCESS, None, None, run_id)


def covered_messages(done: DebounceFinished) -> list[CoveredMessage]:
    """The messages *done* lists, each with its stored ending context (``None``: its result
    only, as for an id whose holder had not confirmed it)."""
    return [CoveredMessage(one, decode_context(done.contexts.get(one), one))
            for one in done.covered]  # fmt: skip


def renew_runs(holds: DebounceHolds, holdings: Iterable[tuple[Ticket, DebounceHolding]],
               now: float) -> int:  # fmt: skip
    """Renew the runs whose hold is due (every third of its lease; each marked renewed now);
    the holds that had run out (logged, and marked lost: their end frees nothing)."""
    holdings = list(holdings)
    due: dict[tuple[Bucket, str, float], list[str]] = {}
    for ticket, holding in holdings:
        if not holding.lost and now - holding.asked >= holding.lease / 3:
            due.setdefault((holding.bucket, holding.holder, holding.lease), []).append(
                ticket.request.id
            )
            holding.asked = now
    count = 0
    for (bucket, holder, lease), ids in due.items():
        lost = holds.call(lambda h: h.renew(bucket, ids, holder, lease))  # noqa: B023
        if not lost:
            continue
        for _, holding in holdings:
            if holding.holder == holder:
                holding.lost = True
        count += len(lost)
        logger.error(
            "celery-extras: the debounce hold of %s ran past its lease (%.0f s) before "
            "renewal (the worker was blocked or cut off from the store); another run of its "
            "key may start", bucket[0], lease,
        )  # fmt: skip
    return count


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


def hurry(consumer: Any, entry: str) -> None:
    """Make the parked next message's entry due now (else it comes back when its wait, or
    the run's lease, would have ended)."""
    arrival = getattr(consumer, DELAY_ATTR, None)
    if arrival is None:
        return
    try:
        arrival.parker.store.hurry(entry)
    except Exception as exc:
        arrival.parker.store_failed("making a parked debounced message due", exc)
