"""The limit gate of the admission pipeline: token-bucket limits before the pool.

The decisions are :class:`~.planner.LimitPlanner`'s, on an injected clock; this gate
asks it for each arriving request of a task with ``limit()`` (one or several), which
admits it under all of them at once (:mod:`.all_of`: taken now, or the slot of the
limit that makes it wait longest booked) and then:

* runs now when the slot is now;
* waits when it is later: held in the worker's timer when the wait is at most
  ``extras_delay_max_hold``, parked in the delay store otherwise (the whole message
  is stored with its booked slot, and only then acked; the worker that receives it
  again checks the slot against the store before it runs it there, so a header
  alone books nothing). The pipeline carries either out.

A held request asked again uses its booked slot if it is at most
:meth:`~.planner.LimitPlanner.late_tolerance` late (its other limits are asked then),
and books a new one otherwise. A cost a limit cannot hand out fails the task at once
(:class:`~celery_extras.admission.gate.Refuse`). Waits are reported with
:data:`celery_extras.signals.task_rate_limited` (naming the limit that held the task);
a shadow limit that would have held it, with :data:`~celery_extras.signals.task_shadow_limited`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery

from ..admission.gate import RUN, Answer, Gate, Hold, Refuse, Ticket
from ..admission.store_round import NO_REPLY, PASSES, StoreCall
from ..clock import monotonic
from ..signals import task_rate_limited, task_shadow_limited
from ..store.client import redis_client, store_key, store_user
from .planner import AHEAD, LimitPlanner
from .rate import format_rate
from .redis_bucket import GlobalTokenBucket
from .spec import limit_id

__all__ = ["Booking", "LimitGate"]

logger = logging.getLogger(__name__)

#: :attr:`Ticket.notes` key of the limits an arriving task meets and its round's store call
ARRIVAL_NOTE = "limit.arrival"
#: ``(task, rate)`` pairs whose stored rate this process has logged (see LimitGate.announce).
_announced: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Booking:
    """The slot a held request booked: when it comes (on the planner's clock), in which
    limit (``None``: every limit was taken already), and how."""

    due: float
    booked: bool
    fallback: bool
    verified: bool
    limit: int | None = 0
    #: the limits whose token the request already holds
    taken: frozenset[int] = frozenset()


class LimitGate(Gate):
    """The limits of one worker's consumer, as a gate of its admission pipeline."""

    label = "limit"

    def __init__(
        self, app: Celery, settings: Mapping[str, Any], clock: Callable[[], float] = monotonic
    ) -> None:
        self.app = app
        self.planner = planner = LimitPlanner(
            settings, lambda: GlobalTokenBucket(redis_client(app), store_key(app)), clock
        )
        planner.store = store_user(app, logger, *planner.outage_texts(), clock)
        self.clock = clock
        #: held: fresh waits held in the worker; parked: fresh waits parked; slot_holds:
        #: released tasks held for the rest of their verified slot (no new wait); refused:
        #: tasks failed at arrival (a cost their limit cannot hand out)
        self.counts = {"admitted": 0, "held": 0, "parked": 0, "slot_holds": 0, "refused": 0}
        #: per task and limit: tasks it held back; for shadow limits, tasks it would have
        #: held and the seconds it would have made them wait
        self.by_limit: dict[str, dict[str, dict[str, float]]] = {}
        self.waiting: set[int] = set()

    def handles(self, name: str) -> bool:
        return name in self.planner.specs

    def register(self, name: str, policies: Any) -> None:
        if policies.limits:
            self.planner.register(name, policies.limits)
            for index in range(len(policies.limits)):
                self._figures(name, index)  # every limit is listed, from 0
            self.announce(name)

    def announce(self, *names: str) -> None:
        """Log, once per limit and rate in this process, a stored rate replacing a ``limit()``.

        Called as the overrides are loaded and as each task registers: the consumer
        builds the tasks' strategies before or after the pipeline starts, as Celery orders
        steps that do not require each other.
        """
        planner = self.planner
        for name in sorted(names):
            for index, spec in enumerate(planner.specs.get(name, ())):
                limit = limit_id(name, index)
                override = planner.overrides.get(limit)
                if override is None:
                    continue
                text = override.text or format_rate(override.rate)
                if (limit, text) in _announced:
                    continue
                _announced.add((limit, text))
                logger.warning(
                    "celery-extras: %s runs at the stored rate %s%s, not its limit() %s "
                    "(set with `celery extras limit`; `celery extras limit --reset %s%s` "
                    "restores it)",
                    limit, text, f" burst {override.burst}" if override.burst else "", spec.text,
                    name, f" --limit {index + 1}" if index else "",
                )  # fmt: skip

    def load_overrides(self) -> None:
        self.planner.load_overrides()
        self.announce(*self.planner.specs)

    def start(self, pipeline: Any, consumer: Any) -> None:
        """The consumer started: the run-time rates stored by ``celery extras limit`` apply."""
        self.load_overrides()

    # -- the gate ------------------------------------------------------------------------------

    def arrival_call(self, ticket: Ticket) -> StoreCall | None:
        """The store's booking of an arriving task, when its answer alone says whether the
        task runs now (see the planner's): the limits as the task meets them noted."""
        if ticket.released_slot is not None or self.label in ticket.notes:
            return None  # a slot booked before: the planner checks it
        arrival = self.planner.arrival_call(ticket.name, ticket.request)
        if arrival is None:
            return None
        ticket.notes[ARRIVAL_NOTE] = arrival
        return PASSES if arrival is AHEAD else arrival[1]

    def admit(self, ticket: Ticket) -> Answer:
        self.waiting.discard(id(ticket.request))
        booking: Booking | None = ticket.notes.pop(self.label, None)
        arrival = ticket.notes.pop(ARRIVAL_NOTE, None)
        if arrival is AHEAD:  # a call booked ahead: it runs (no shadow limit, nothing held)
            self.counts["admitted"] += 1
            return RUN
        reply = ticket.reply(self.label)
        if reply is not NO_REPLY:
            plan = self.planner.plan(ticket.name, ticket.request, arrived=(*arrival, reply))
        elif booking is not None and self._keeps(ticket.name, booking):
            plan = self.planner.plan(ticket.name, ticket.request, booking.due, booking.limit,
                                     booking.taken)  # fmt: skip
        else:
            plan = self.planner.plan(ticket.name, ticket.request, *(ticket.released_slot or ()))
        ticket.released_slot = None
        for index, wait in plan.shadowed:
            entry = self._figures(ticket.name, index)
            entry["shadow"] += 1
            entry["shadow_wait"] += wait
            task_shadow_limited.send(sender=ticket.name, request=ticket.request, wait=wait,
                                     limit=self.limit_label(ticket.name, index))  # fmt: skip
        if plan.action == "run":
            self.counts["admitted"] += 1
            return RUN
        if plan.action == "refuse":
            self.counts["refused"] += 1
            return Refuse(plan.error)
        if not plan.verified:
            held_by = None if plan.held_by is None else self.limit_label(ticket.name, plan.held_by)
            if plan.held_by is not None:
                self._figures(ticket.name, plan.held_by)["held"] += 1
            task_rate_limited.send(sender=ticket.name, request=ticket.request, wait=plan.wait,
                                   limit=held_by)  # fmt: skip
        ticket.notes[self.label] = Booking(
            plan.due, plan.booked, plan.fallback, plan.verified, plan.limit, plan.taken
        )
        return Hold(plan.wait, park=self._park_kind(ticket.name, plan), due=plan.due)

    def _park_kind(self, name: str, plan: Any) -> str | None:
        """The kind of the delay-store entry a parked request gets: ``"limit"`` for a slot of
        the first limit, ``"limit:<index>"`` for another global one (the store verifies it
        when released), ``"limit:worker"`` for a wait on a worker's own bucket, in which no
        slot is booked: released (maybe to another worker), it asks its limits again. The
        other limits whose token it holds already (narrow ones book theirs at arrival)
        follow a ``/``: ``"limit/1,2"``, so that they are not asked again when it returns."""
        if plan.action != "park":
            return None
        index = plan.limit or 0
        if self.planner.specs[name][index].scope == "worker":
            return "limit:worker"
        kind = "limit" if index == 0 else f"limit:{index}"
        held = sorted(plan.taken - {index})
        return f"{kind}/{','.join(map(str, held))}" if held else kind

    def limit_label(self, name: str, index: int) -> str:
        """How the stats name the *index*-th limit of *name*: its rate, and its place (top
        first) when the task has several."""
        specs = self.planner.specs[name]
        return specs[index].text if len(specs) == 1 else f"{index + 1}: {specs[index].text}"

    def _figures(self, name: str, index: int) -> dict[str, float]:
        per_task = self.by_limit.setdefault(name, {})
        label = self.limit_label(name, index)
        if label not in per_task:
            per_task[label] = {"held": 0, "shadow": 0, "shadow_wait": 0.0}
        return per_task[label]

    def _keeps(self, name: str, booking: Booking) -> bool:
        """Whether a held request runs on the slot it booked, or books again: a slot of
        the fallback bucket is booked again on the store once it may answer (its bucket
        never saw this slot; running on both would exceed the limit after a failover),
        and a slot missed by more than the late tolerance is booked again."""
        store = self.planner.store
        if booking.fallback and (not store.down or store.up()):
            return False
        late = self.clock() - booking.due
        return booking.booked and late <= self.planner.late_tolerance(name, booking.limit)

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
        limits: dict[str, Any] = {}
        for name, specs in planner.specs.items():
            described = []
            for index, spec in enumerate(specs):
                entry = spec.describe()
                override = planner.overrides.get(limit_id(name, index))
                if override is not None:
                    entry["override"] = override.text or format_rate(override.rate)
                    if override.burst:
                        entry["burst"] = override.burst
                if planner.shadow(spec):
                    entry["shadow"] = True
                described.append(entry)
            limits[name] = described[0] if len(described) == 1 else {"limits": described}
        return {
            "limits": limits,
            "by_limit": self.by_limit,
            "waiting": len(self.waiting),
            **self.counts,
            "booked_ahead": planner.ahead.spent,
            "store_errors": planner.store.errors,
            **planner.store.info(),
            "on_store_error": planner.on_store_error,
            "max_hold": planner.max_hold,
        }
