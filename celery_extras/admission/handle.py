"""What a gate may ask of the pipeline that admits its requests: a narrow handle.

A gate is handed a :class:`GateHandle` at its start, never the pipeline, so that it can do
what a policy needs (let a request it kept go on, park it, make a parked entry due now, say
how a request it ran itself ended) and nothing else: a gate reads no pipeline internals and
never reaches through the consumer for the delay store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .gate import RUN, Answer, Ticket
from .registry import TaskPolicies

__all__ = ["GateHandle", "ParkedEntries"]


class ParkedEntries(Protocol):
    """The delay store as a gate's handle uses it (:class:`~..delay.parking.Parker`)."""

    store: Any

    def store_failed(self, what: str, exc: BaseException) -> None: ...


class GateHandle:
    """One consumer's pipeline as its gates see it: :meth:`resume`, :meth:`park`,
    :meth:`hurry`, :meth:`ended`, and the two questions a gate asks of it
    (:meth:`in_pool`, :meth:`purged`); :meth:`submit` for a gate that admits tasks with no
    policy of their own (a capped queue's)."""

    def __init__(self, pipeline: Any, consumer: Any) -> None:  # a .pipeline.Pipeline
        self._pipeline = pipeline
        self.consumer = consumer

    def resume(self, ticket: Ticket, answer: Answer = RUN) -> None:
        """The gate that queued *ticket* answers now: ``RUN`` (on to the next gate) or
        ``COVERED`` (acked, never run)."""
        self._pipeline.resume(ticket, answer)

    def park(self, ticket: Ticket, kind: str, seconds: float) -> str | None:
        """Park *ticket*, queued in the gate, in the delay store for *seconds*: its entry's
        id, or ``None`` (still queued) when it cannot be parked."""
        entry: str | None = self._pipeline.park_queued(ticket, kind, seconds)
        return entry

    def ended(self, ticket: Ticket, retry_in: float | None = None, outcome: Any = None) -> None:
        """*ticket*, which the gate ran itself (a batch), ended: the gates before it hear."""
        self._pipeline.ended(ticket, retry_in, outcome)

    def in_pool(self, request: Any) -> bool:
        """Whether *request* was let through every gate (in the pool, or on its way)."""
        ticket = self._pipeline.admitted.get(id(request))
        return ticket is not None and ticket.request is request

    def hurry(self, entry: str, what: str) -> None:
        """Make the parked message of *entry* (*what* it is) due now, else it comes back only
        when its wait, or the run's lease, would have ended. A store error is logged."""
        parked = self._parked()
        if parked is None:
            return
        try:
            parked.store.hurry(entry)
        except Exception as exc:
            parked.store_failed(f"making {what} due", exc)

    def purged(self, entries: Sequence[str]) -> dict[str, bool | None] | None:
        """What a purge did to the parked *entries* (:meth:`~..delay.store.DelayStore.purged`),
        or ``None`` when there is no delay store or it failed (logged)."""
        parked = self._parked()
        if parked is None:
            return None
        try:
            fates: dict[str, bool | None] = parked.store.purged(list(entries))
        except Exception as exc:
            parked.store_failed("checking the parked waiting runs", exc)
            return None
        return fates

    def has_gates(self, name: str) -> bool:
        """Whether task *name* has gates of its own (a policy): its requests pass them."""
        return name in self._pipeline.chains

    def submit(self, request: Any, name: str) -> None:
        """Admit *request* of task *name* through the gates that handle it; a task with no
        policy (a capped queue's) is registered with none first."""
        if name not in self._pipeline.chains:
            self._pipeline.register(name, TaskPolicies())
        self._pipeline.submit(self.consumer, request, name)

    def _parked(self) -> ParkedEntries | None:
        arrival = self._pipeline.arrival
        return arrival.parker if arrival is not None else None
