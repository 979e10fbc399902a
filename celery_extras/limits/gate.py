"""The limit gate of the admission pipeline: token-bucket limits before the pool.

The decisions are :class:`~.planner.LimitPlanner`'s, on an injected clock; this gate
asks it for each arriving request of a task with ``limit()``, which books a slot
in its bucket (global on Redis, or local) and then:

* runs now when the slot is now;
* waits when it is later: held in the worker's timer when the wait is at most
  ``extras_limit_max_hold``, parked in the delay store otherwise (the whole message
  is stored with its booked slot, and only then acked; the worker that receives it
  again checks the slot against the store before it runs it there, so a header
  alone books nothing). The pipeline carries either out.

A held request asked again uses its booked slot if it is at most
:meth:`~.planner.LimitPlanner.late_tolerance` late, and books a new one otherwise.
Waits are reported with :data:`celery_extras.signals.task_rate_limited`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery

from ..admission.gate import RUN, Answer, Gate, Hold, Ticket
from ..signals import task_rate_limited
from ..store.client import redis_client, store_key, store_user
from .planner import LimitPlanner
from .rate import format_rate
from .redis_bucket import GlobalTokenBucket

__all__ = ["Booking", "LimitGate"]

logger = logging.getLogger(__name__)

#: ``(task, rate)`` pairs whose stored rate this process has logged (see LimitGate.announce).
_announced: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Booking:
    """The slot a held request booked: when it comes (on the planner's clock), and how."""

    due: float
    booked: bool
    fallback: bool
    verified: bool


class LimitGate(Gate):
    """The limits of one worker's consumer, as a gate of its admission pipeline."""

    label = "limit"

    def __init__(
        self, app: Celery, settings: Mapping[str, Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.app = app
        self.planner = planner = LimitPlanner(
            settings, lambda: GlobalTokenBucket(redis_client(app), store_key(app)), clock
        )
        planner.store = store_user(app, logger, *planner.outage_texts(), clock)
        self.clock = clock
        #: held: fresh waits held in the worker; parked: fresh waits parked; slot_holds:
        #: released tasks held for the rest of their verified slot (no new wait)
        self.counts = {"admitted": 0, "held": 0, "parked": 0, "slot_holds": 0}
        self.waiting: set[int] = set()

    def handles(self, name: str) -> bool:
        return name in self.planner.specs

    def register(self, name: str, policies: Any) -> None:
        if policies.limit is not None:
            self.planner.register(name, policies.limit)
            self.announce(name)

    def announce(self, *names: str) -> None:
        """Log, once per task and rate in this process, a stored rate replacing a ``limit()``.

        Called as the overrides are loaded and as each task registers: the consumer
        builds the tasks' strategies before or after the pipeline starts, as Celery orders
        steps that do not require each other.
        """
        planner = self.planner
        for name in sorted(names):
            override, spec = planner.overrides.get(name), planner.specs.get(name)
            if override is None or spec is None:
                continue
            text = override.text or format_rate(override.rate)
            if (name, text) in _announced:
                continue
            _announced.add((name, text))
            logger.warning(
                "celery-extras: %s runs at the stored rate %s%s, not its limit() %s "
                "(set with `celery extras limit`; `celery extras limit --reset %s` restores it)",
                name, text, f" burst {override.burst}" if override.burst else "", spec.text, name,
            )  # fmt: skip

    def load_overrides(self) -> None:
        self.planner.load_overrides()
        self.announce(*self.planner.overrides)

    # -- the gate ------------------------------------------------------------------------------

    def admit(self, ticket: Ticket) -> Answer:
        self.waiting.discard(id(ticket.request))
        booking: Booking | None = ticket.notes.pop(self.label, None)
        if booking is not None and self._keeps(ticket.name, booking):
            self.counts["admitted"] += 1
            return RUN
        slot, ticket.released_slot = ticket.released_slot, None
        plan = self.planner.plan(ticket.name, ticket.request, slot)
        if plan.action == "run":
            self.counts["admitted"] += 1
            return RUN
        if not plan.verified:
            task_rate_limited.send(sender=ticket.name, request=ticket.request, wait=plan.wait)
        ticket.notes[self.label] = Booking(plan.due, plan.booked, plan.fallback, plan.verified)
        return Hold(plan.wait, park="limit" if plan.action == "park" else None, due=plan.due)

    def _keeps(self, name: str, booking: Booking) -> bool:
        """Whether a held request runs on the slot it booked, or books again: a slot of
        the fallback bucket is booked again on the store once it may answer (its bucket
        never saw this slot; running on both would exceed the limit after a failover),
        and a slot missed by more than the late tolerance is booked again."""
        store = self.planner.store
        if booking.fallback and (not store.down or store.up()):
            return False
        return booking.booked and self.clock() - booking.due <= self.planner.late_tolerance(name)

    def held(self, ticket: Ticket, answer: Hold, parked: bool) -> None:
        booking: Booking = ticket.notes[self.label]
        if parked:
            self.counts["parked"] += 1
            return
        self.waiting.add(id(ticket.request))
        self.counts["slot_holds" if booking.verified else "held"] += 1

    def stop(self) -> None:
        self.waiting.clear()

    def info(self) -> dict[str, Any]:
        planner = self.planner
        limits = {}
        for name, spec in planner.specs.items():
            entry = spec.describe()
            override = planner.overrides.get(name)
            if override is not None:
                entry["override"] = override.text or format_rate(override.rate)
                if override.burst:
                    entry["burst"] = override.burst
            limits[name] = entry
        return {
            "limits": limits,
            "waiting": len(self.waiting),
            **self.counts,
            "store_errors": planner.store.errors,
            **planner.store.info(),
            "on_store_error": planner.on_store_error,
            "max_hold": planner.max_hold,
        }
