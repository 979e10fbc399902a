"""The debounce gate of the admission pipeline: a key runs once it has been quiet.

The gate of a task with ``debounce()`` (right after coalescing's). Each arriving message of
a key asks the holds (:class:`~.redis_holds.RedisDebounce`, or with no store this worker's
:class:`~.table.DebounceTable`) what it does:

* **wait**: it is its key's *next* message (the last of the burst), held here (unacked, no
  pool slot, the prefetch window widened) until the burst is due (``wait`` seconds of
  quiet, ``max_wait`` after the burst's first message at the latest), or until its key's
  run ends: it asks again then (a release notice, or its own timer). Held longer than
  ``extras_delay_max_hold`` where the app's workers release parked tasks (it parks for
  another reason: a ``limit()``, a ``retry_policy()``, ``coalesce()``, the ETA store), it
  is parked in the delay store (stored, then acked) for what is left of its wait, and asks
  again wherever it comes back; elsewhere it stays held, unacked, its lease renewed by its
  asks (a copy the broker delivers twice is told it is covered by itself);
* **run**: it goes on to the next gates, then the pool; its hold is renewed every third of
  the lease until the pipeline hears it end, then freed, and every message it covered ends
  as if it had run with its outcome (:mod:`~celery_extras.admission.covered`: result,
  callbacks, chain, chord part, signal). A run that ends in a retry keeps the hold for its
  retry; one parked by a later gate, or dropped with a lost connection, keeps it for
  whichever worker receives it next;
* **covered**: a message of its key sent later replaced it (or it was sent before the
  run's own message): it is acked and counted ``debounced`` (it takes no token and no
  slot); its ending context went to the holds with the verdict, so whichever worker ends
  the covering run ends it. Covered by a run that has ended, it ends here, then is acked.

While the store cannot be reached, ``extras_debounce_on_store_error`` says what a message
does: ``'hold'`` waits (unacked) and asks again every ``extras_store_retry`` seconds,
``'run'`` runs without debouncing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery
from celery.signals import task_revoked

from .. import compat
from ..admission.covered import CoveredEndings, context_of, encode_context
from ..admission.gate import COVERED, QUEUED, RUN, Answer, Gate, Hold, HolderIds, Ticket
from ..admission.key_runs import (
    covered_messages,
    discarded_key,
    known_outcome,
    revoked_outcome,
)
from ..admission.notices import Bucket, ReleaseNotices
from ..admission.sent import sent_at
from ..admission.serial import serial
from ..admission.spec import call_key
from ..clock import monotonic, wall
from ..delay.capability import parking_uses
from ..delay.gate import hurry
from ..signals import task_debounced
from ..store.client import store_user
from .endings import DebounceHolding, Waiting, per_task, renew_runs
from .holds import DebounceHolds, DebounceStore
from .spec import DebounceSpec
from .table import DebounceFinished, DebounceVerdict

__all__ = ["ASK_AGAIN", "CONSEQUENCE", "CONTEXT_NOTE", "LATE", "DebounceGate"]

logger = logging.getLogger("celery_extras.debounce")

#: Longest a waiting message goes without asking again: it renews its hold, learns soon
#: that a later message replaced it, and runs soon should a run's release notice be lost.
ASK_AGAIN = 1.0
#: :attr:`Ticket.notes` key of a message's ending context (JSON text, made once)
CONTEXT_NOTE = "debounce.context"
#: Asked a little after a wait ends, so that the store (its clock) finds it ended.
LATE = 0.005
#: What an outage of the store means, by ``extras_debounce_on_store_error``.
CONSEQUENCE = {
    "hold": "debounced tasks wait (unacked) until it answers",
    "run": "debounced tasks run without debouncing until it answers",
}


class DebounceGate(Gate):
    """The debounce holds of one worker's consumer, as a gate of its admission pipeline."""

    label = "debounce"
    hears_endings = True

    def __init__(self, app: Celery, settings: Mapping[str, Any],
                 clock: Callable[[], float] = monotonic,
                 wall: Callable[[], float] = wall) -> None:  # fmt: skip
        self.app = app
        self.clock, self.wall = clock, wall
        self.on_store_error: str = settings["debounce_on_store_error"]
        self.store_retry: float = settings["store_retry"]
        self.max_hold: float = settings["delay_max_hold"]
        self.specs: dict[str, DebounceSpec] = {}
        self.health = store_user(app, logger, "debounce holds",
                                 CONSEQUENCE[self.on_store_error], clock)  # fmt: skip
        self.holds = DebounceHolds(app, self.health, wall)
        self.holders = HolderIds()
        self.holding: dict[int, tuple[Ticket, DebounceHolding]] = {}  # runs, by id(request)
        self.waiting = Waiting()
        self.endings = CoveredEndings(app)
        self.notices = ReleaseNotices(self.wake, "debounce")
        self.counts = {"runs": 0, "debounced": 0, "waited": 0, "parked": 0, "unheld": 0,
                       "lost_holds": 0}  # fmt: skip
        self._pipeline: Any = None
        self._consumer: Any = None
        self.parks = False

    def handles(self, name: str) -> bool:
        return name in self.specs

    def register(self, name: str, policies: Any) -> None:
        spec = getattr(policies, "debounce", None)
        if spec is not None:
            self.specs[name] = spec

    def start(self, pipeline: Any, consumer: Any) -> None:
        self._pipeline, self._consumer = pipeline, consumer
        self.parks = bool(parking_uses(self.app))  # its workers release what is parked
        self.notices.start(consumer)
        task_revoked.connect(serial(consumer).wrap(self._discarded), weak=False,
                             dispatch_uid=f"debounce.{id(self)}")  # fmt: skip
        if self.specs and not self.holds.shared:
            logger.warning(
                "celery-extras: no store (extras_redis_url, or a Redis broker): debounce() "
                "holds are kept per worker, so each worker debounces its own messages"
            )

    # -- asking --------------------------------------------------------------------------------

    def admit(self, ticket: Ticket) -> Answer:
        spec = self.specs[ticket.name]
        bucket = (ticket.name, call_key(ticket.name, spec.key, ticket.request, "debounce", "key",
                                        logger))  # fmt: skip
        holder = ticket.holder(self.label, self.holders)
        holding = DebounceHolding(bucket, holder, spec.lease, self.clock())
        verdict = self._ask(ticket, holding)
        if verdict is None:
            if self.on_store_error == "run":
                self.counts["unheld"] += 1
                return RUN
            return Hold(self.store_retry)
        return self._answer(ticket, holding, verdict, queued=False)

    def _ask(self, ticket: Ticket, holding: DebounceHolding) -> DebounceVerdict | None:
        """The holds' verdict on *ticket*, or ``None`` when the store cannot answer."""
        spec = self.specs[ticket.name]
        request = ticket.request
        headers = getattr(request.message, "headers", None) or {}
        retries = headers.get("retries")
        retries = retries if isinstance(retries, int) and not isinstance(retries, bool) else 0
        sent = sent_at(headers, getattr(request, "eta", None), self.wall())
        context = ticket.notes.get(CONTEXT_NOTE)
        if context is None:
            context = ticket.notes[CONTEXT_NOTE] = encode_context(context_of(request))
        holding.asked = self.clock()

        def ask(holds: DebounceStore) -> DebounceVerdict:
            return holds.ask(holding.bucket, request.id, sent, holding.holder, spec.wait,
                             spec.max_wait, spec.lease, retries, context)  # fmt: skip

        return self.holds.claim(ask)

    def _answer(
        self, ticket: Ticket, holding: DebounceHolding, verdict: DebounceVerdict, queued: bool
    ) -> Answer:
        if verdict.kind == "run":
            self.counts["runs"] += 1
            self.holding[id(ticket.request)] = (ticket, holding)
            return RUN
        if verdict.kind == "covered":
            self.counts["debounced"] += 1
            task_debounced.send(sender=ticket.name, request=ticket.request, by=verdict.by)
            if verdict.ended:  # by a run that has ended: it ends here, then is acked
                self.endings.end_here(self._consumer, self._pipeline, ticket, verdict.by)
                return QUEUED
            return COVERED
        # asked again once its wait ends: at the latest every ASK_AGAIN seconds (its renewal,
        # and should the release notice of the run it waits for be lost)
        holding.waits = verdict.due
        holding.next_ask = holding.asked + min(ASK_AGAIN, holding.lease / 3, verdict.due + LATE)
        if not queued:
            holding.since = holding.asked
            self.counts["waited"] += 1
            self.waiting.add(ticket, holding)
            self.holds.listen(self.notices)
        if self._consumer is not None:  # on time, between two ticks of the pipeline
            delay = max(holding.next_ask - self.clock(), 0.0)
            serial(self._consumer).call_after(delay, self.ask_due)
        return QUEUED

    def ask_due(self) -> None:
        """Ask again for the waiting messages whose wait has ended."""
        for bucket in self.waiting.due(self.clock()):
            self.wake(bucket, due_only=True)

    def wake(self, bucket: Bucket, due_only: bool = False) -> None:
        """Ask again for the waiting messages of *bucket* (every bucket for :data:`ALL`):
        a run of it ended (or, *due_only*, those whose wait ended)."""
        now = self.clock()
        for one, ticket, holding in self.waiting.named(bucket):
            if due_only and now < holding.next_ask:
                continue
            verdict = self._ask(ticket, holding)
            if verdict is None:
                holding.next_ask = holding.asked + self.store_retry
                continue
            answer = self._answer(ticket, holding, verdict, queued=True)
            if answer is not QUEUED or (verdict.kind == "covered" and verdict.ended):
                self.waiting.remove(one, ticket)
                if answer is not QUEUED:
                    self._pipeline.resume(ticket, answer)

    # -- endings -------------------------------------------------------------------------------

    def finished(self, ticket: Ticket) -> None:
        """The run ended: free its key (or keep it for its retry), copy its outcome to what
        it covered, and let this worker's next message of the key ask at once."""
        found = self.holding.pop(id(ticket.request), None)
        if found is None:
            return
        holding, mid = found[1], ticket.request.id
        if ticket.retry_in is not None:
            self._step_aside(ticket, holding, ticket.retry_in)
            return
        done = self.holds.call(lambda h: h.finish(holding.bucket, mid, holding.holder))
        if done is None:
            return
        self.endings.schedule(self._consumer, ticket.name, mid, covered_messages(done),
                              known=known_outcome(ticket))  # fmt: skip
        if done.parked:
            hurry(self._consumer, done.parked, "a parked debounced message")
        if holding.bucket in self.waiting:
            self.wake(holding.bucket)

    def _park_long_waits(self, now: float) -> None:
        """Park what waits here over ``extras_delay_max_hold`` (see the module docstring)."""
        for bucket, ticket, holding in self.waiting.held_since(now - self.max_hold):
            seconds = max(holding.waits - (now - holding.asked), 0.0)  # back at its due time
            entry = self._pipeline.park_queued(ticket, "debounce", seconds) if self.parks else None
            if entry is None:
                holding.since = now  # cannot park (no delay store, store down): held
                continue
            self.waiting.remove(bucket, ticket)
            self.counts["parked"] += 1
            mid, holder, lease = ticket.request.id, holding.holder, holding.lease
            self.holds.call(lambda h: h.park_next(bucket, mid, holder, entry, seconds, lease))  # noqa: B023

    def _discarded(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        """``task_revoked``: Celery discarded a message (revoked, expired): the next message
        of its key or a run between attempts goes, and what it covered ends revoked."""
        found = discarded_key(self.app, self.specs, sender, request, "debounce")
        if found is None:
            return
        (bucket, task_id) = found
        dropped: DebounceFinished | None = self.holds.call(lambda h: h.drop(bucket, task_id))
        if dropped is not None:
            self.endings.schedule(self._consumer, bucket[0], task_id, covered_messages(dropped),
                                  known=revoked_outcome(task_id))  # fmt: skip

    def yielded(self, ticket: Ticket, seconds: float) -> None:
        found = self.holding.pop(id(ticket.request), None)
        if found is not None:
            self._step_aside(ticket, found[1], seconds)

    def _step_aside(self, ticket: Ticket, one: DebounceHolding, seconds: float) -> None:
        mid = ticket.request.id
        self.holds.call(lambda h: h.step_aside(one.bucket, mid, one.holder, seconds, one.lease))

    def stop(self) -> None:
        """Waiting messages are dropped (the broker delivers them again: their burst waits for
        them); runs not in the pool yet keep their hold for whoever receives them next."""
        for bucket, ticket, holding in self.waiting.take_all():
            compat.forget_held(ticket.request)
            mid, holder = ticket.request.id, holding.holder
            self.holds.call(lambda h: h.forget(bucket, mid, holder))  # noqa: B023
        self.endings.forget_here()
        admitted = self._pipeline.admitted if self._pipeline is not None else {}
        for key, (ticket, holding) in list(self.holding.items()):
            if key not in admitted:
                del self.holding[key]
                self._step_aside(ticket, holding, 0.0)
        self.notices.stop()
        task_revoked.disconnect(dispatch_uid=f"debounce.{id(self)}")

    # -- renewal -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Renew the runs' holds due (every third of the lease), ask again for the waiting
        messages due, and park those held too long."""
        now = self.clock()
        self.counts["lost_holds"] += renew_runs(self.holds, self.holding.values(), now)
        self.ask_due()
        self._park_long_waits(now)

    def queued(self) -> int:
        return len(self.waiting) + len(self.endings.here)

    def info(self) -> dict[str, Any]:
        return {
            "tasks": per_task(self.specs, self.holding.values(), self.waiting),
            **self.counts,
            **{f"covered_{what}": count for what, count in self.endings.counts.items()},
            "holds": "shared" if self.holds.shared else "worker",
            **self.health.info(),
            "on_store_error": self.on_store_error,
        }
