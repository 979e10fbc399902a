"""The coalescing gate of the admission pipeline: one run per key, cluster-wide.

The first gate of a task with ``coalesce()``. Each arriving message of a key asks the
holds (:class:`~.redis_holds.RedisHolds`, or with no store this worker's
:class:`~.table.CoalesceTable`) what it does:

* **run**: it goes on to the next gates, then the pool; its hold is renewed every
  third of the lease until the pipeline hears it end, then freed, and every message it
  covered ends as if it had run with its outcome (:mod:`~celery_extras.admission.covered`:
  result, callbacks, chain, chord part, signal). A run that ends in a retry
  keeps the hold for its retry; one parked by a later gate, or dropped with a lost
  connection, keeps it for whichever worker receives it next;
* **covered**: its message is acked and counted ``coalesced`` (it takes no token
  and no slot); its ending context went to the holds with the verdict, so whichever
  worker ends the covering run ends it. Covered by a run that has ended already, it
  ends here, then is acked;
* **wait**: it is this key's waiting run, held here (unacked, no pool slot, the
  prefetch window widened) until the run ends: a release notice (or, should one be
  lost, its next renewal) asks again. Held longer than ``extras_delay_max_hold``, it
  is parked in the delay store (stored, then acked) until the run's lease ends; the
  run's end makes it due at once, and whichever worker receives it asks again.

While the store cannot be reached, ``extras_coalesce_on_store_error`` says what a
message does: ``'hold'`` waits (unacked) and asks again every
``extras_store_retry`` seconds, ``'run'`` runs without coalescing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery
from celery.signals import task_revoked

from .. import compat
from ..admission.covered import (
    CoveredEndings,
    Outcome,
    context_of,
    encode_context,
)
from ..admission.gate import COVERED, QUEUED, RUN, Answer, Gate, Hold, HolderIds, Ticket
from ..admission.key_runs import (
    covered_messages,
    discarded_key,
    known_outcome,
    revoked_outcome,
)
from ..admission.notices import ALL, Bucket, ReleaseNotices
from ..admission.sent import sent_at
from ..admission.serial import serial
from ..admission.spec import call_key
from ..admission.store_round import NO_REPLY, StoreCall
from ..clock import monotonic, wall
from ..delay.gate import hurry
from ..signals import task_coalesced
from ..store.client import store_user
from .holds import Holds
from .runs import CoalesceHolding, RunHolds
from .spec import CoalesceSpec
from .table import CoalesceFinished, CoalesceVerdict

__all__ = ["ASK_AGAIN", "CONTEXT_NOTE", "CoalesceGate", "CoalesceHolding"]

logger = logging.getLogger("celery_extras.coalesce")

#: Longest a waiting run goes without asking again, should every release notice be lost.
ASK_AGAIN = 1.0
#: :attr:`Ticket.notes` key of a message's ending context (JSON text, made once)
CONTEXT_NOTE = "coalesce.context"


#: What the holds are asked of a message: its id, when it was sent, its holder, lease,
#: ``keep``, retries and ending context.
Question = tuple[str, float, str, float, str, int, str]


def new_holding(ticket: Ticket, spec: CoalesceSpec, holders: HolderIds, now: float
                ) -> CoalesceHolding:  # fmt: skip
    """A new hold of *ticket*'s key, under the delivery's holder id (one of *holders*)."""
    key = call_key(ticket.name, spec.key, ticket.request, "coalesce", "key", logger)
    holder = ticket.holder(CoalesceGate.label, holders)
    return CoalesceHolding((ticket.name, key), holder, spec.lease, now)


def question(ticket: Ticket, spec: CoalesceSpec, holding: CoalesceHolding, wall: float
             ) -> Question:  # fmt: skip
    """What the holds are asked of *ticket* (its ending context encoded once, kept in its
    notes); *wall*: the time now, for a message with no send-time stamp."""
    request = ticket.request
    headers = getattr(request.message, "headers", None) or {}
    retries = headers.get("retries")
    retries = retries if isinstance(retries, int) and not isinstance(retries, bool) else 0
    sent = sent_at(headers, getattr(request, "eta", None), wall)
    context = ticket.notes.get(CONTEXT_NOTE)
    if context is None:
        context = ticket.notes[CONTEXT_NOTE] = encode_context(context_of(request))
    return (request.id, sent, holding.holder, spec.lease, spec.keep, retries, context)


class CoalesceGate(Gate):
    """The coalescing holds of one worker's consumer, as a gate of its admission pipeline."""

    label = "coalesce"
    hears_endings = True

    def __init__(self, app: Celery, settings: Mapping[str, Any],
                 clock: Callable[[], float] = monotonic,
                 wall: Callable[[], float] = wall) -> None:  # fmt: skip
        self.app = app
        self.clock = clock
        self.wall = wall
        self.on_store_error: str = settings["coalesce_on_store_error"]
        self.store_retry: float = settings["store_retry"]
        self.max_hold: float = settings["delay_max_hold"]
        self.specs: dict[str, CoalesceSpec] = {}
        consequence = {
            "hold": "coalesced tasks wait (unacked) until it answers",
            "run": "coalesced tasks run without coalescing until it answers",
        }
        self.health = store_user(app, logger, "coalescing holds",
                                 consequence[self.on_store_error], clock)  # fmt: skip
        self.holds = Holds(app, self.health, wall)
        self.holders = HolderIds()
        self.runs = RunHolds(self.holds)
        self.waiting: dict[Bucket, list[tuple[Ticket, CoalesceHolding]]] = {}
        self.endings = CoveredEndings(app)
        self.notices = ReleaseNotices(self.wake, "coalescing")
        self.counts = {"runs": 0, "coalesced": 0, "waited": 0, "parked": 0, "unheld": 0}
        self._pipeline: Any = None
        self._consumer: Any = None

    def handles(self, name: str) -> bool:
        return name in self.specs

    def register(self, name: str, policies: Any) -> None:
        if policies.coalesce is not None:
            self.specs[name] = policies.coalesce

    def start(self, pipeline: Any, consumer: Any) -> None:
        self._pipeline, self._consumer = pipeline, consumer
        self.notices.start(consumer)
        task_revoked.connect(serial(consumer).wrap(self._discarded), weak=False,
                             dispatch_uid=f"coalesce.{id(self)}")  # fmt: skip
        if self.specs and not self.holds.shared:
            logger.warning(
                "celery-extras: no store (extras_redis_url, or a Redis broker): coalesce() "
                "holds are kept per worker, so two workers may run one key at once"
            )

    # -- asking --------------------------------------------------------------------------------

    def arrival_call(self, ticket: Ticket) -> StoreCall | None:
        """The store's ask, when the holds are the store's and it may answer (hold noted)."""
        if not self.holds.joins_rounds():
            return None
        holding = ticket.notes[self.label] = new_holding(ticket, self.specs[ticket.name],
                                                         self.holders, self.clock())  # fmt: skip
        return self.holds.ask_call(holding.bucket, *self._question(ticket, holding),
                                   may_wait=True)  # fmt: skip

    def _question(self, ticket: Ticket, holding: CoalesceHolding) -> Question:
        """What the holds are asked of *ticket*, now."""
        holding.asked = self.clock()
        return question(ticket, self.specs[ticket.name], holding, self.wall())

    def admit(self, ticket: Ticket) -> Answer:
        holding = ticket.notes.pop(self.label, None) or new_holding(
            ticket, self.specs[ticket.name], self.holders, self.clock())  # fmt: skip
        reply = ticket.reply(self.label)  # the round's, asked as arrival_call put it
        verdict = (self.holds.asked(reply) if reply is not NO_REPLY else
                   self.holds.ask(holding.bucket, *self._question(ticket, holding)))  # fmt: skip
        if verdict is None:
            if self.on_store_error == "run":
                self.counts["unheld"] += 1
                return RUN
            return Hold(self.store_retry)
        return self._answer(ticket, holding, verdict, queued=False)

    def _answer(
        self, ticket: Ticket, holding: CoalesceHolding, verdict: CoalesceVerdict, queued: bool
    ) -> Answer:
        if verdict.kind == "run":
            self.counts["runs"] += 1
            self.runs.add(ticket, holding)
            return RUN
        if verdict.kind == "covered":
            self.counts["coalesced"] += 1
            task_coalesced.send(sender=ticket.name, request=ticket.request, by=verdict.by)
            if verdict.ended:  # by a run that has ended: it ends here, then is acked
                self.endings.end_here(self._consumer, self._pipeline, ticket, verdict.by)
                return QUEUED
            return COVERED
        # ask again when the run's lease ends (its worker may have died), at the latest
        holding.next_ask = holding.asked + min(ASK_AGAIN, holding.lease / 3, verdict.due + 0.005)
        holding.run_due = verdict.due
        if not queued:
            holding.since = holding.asked
            self.counts["waited"] += 1
            self.waiting.setdefault(holding.bucket, []).append((ticket, holding))
            self.holds.listen(self.notices)
        return QUEUED

    def wake(self, bucket: Bucket) -> None:
        """Ask again for the waiting runs of *bucket* (every bucket for :data:`ALL`)."""
        for one in list(self.waiting) if bucket == ALL else [bucket]:
            for ticket, holding in list(self.waiting.get(one, ())):
                verdict = self.holds.ask(holding.bucket, *self._question(ticket, holding))
                if verdict is None:
                    holding.next_ask = holding.asked + self.store_retry
                    continue
                answer = self._answer(ticket, holding, verdict, queued=True)
                if verdict.kind == "covered" and verdict.ended:
                    self._unwait(one, ticket)  # ending here (CoveredEndings.end_here)
                elif answer is not QUEUED:
                    self._unwait(one, ticket)
                    self._pipeline.resume(ticket, answer)

    def _unwait(self, bucket: Bucket, ticket: Ticket) -> None:
        waiting = [w for w in self.waiting.get(bucket, []) if w[0] is not ticket]
        if waiting:
            self.waiting[bucket] = waiting
        else:
            self.waiting.pop(bucket, None)

    # -- endings -------------------------------------------------------------------------------

    def _end_covered(self, name: str, by: str, done: CoalesceFinished, known: Outcome) -> None:
        """End the messages run *by* covered with its outcome (stored, else *known*)."""
        self.endings.schedule(self._consumer, name, by, covered_messages(done), known=known)

    def ending_call(self, ticket: Ticket) -> StoreCall | None:
        """The store's finish of a run that ended (not retrying), if the store may answer
        (a call that may wait, unless a run of its key waits here)."""
        holding = self.runs.get(ticket)
        if holding is None or ticket.retry_in is not None or not self.holds.joins_rounds():
            return None
        return self.holds.finish_call(holding.bucket, ticket.request.id, holding.holder,
                                      may_wait=holding.bucket not in self.waiting)  # fmt: skip

    def finished(self, ticket: Ticket) -> None:
        """The run ended: free its key (or keep it for its retry), copy its result to what
        it covered, and let this worker's waiting run of the key ask at once."""
        holding = self.runs.pop(ticket)
        if holding is None:
            return
        if ticket.retry_in is not None:
            self.runs.step_aside(ticket, holding, ticket.retry_in)
            return
        done: CoalesceFinished | None = self.holds.finish(
            holding.bucket, ticket.request.id, holding.holder, ticket.reply(self.label)
        )
        if done is None:
            return
        if done.covered:
            self._end_covered(ticket.name, ticket.request.id, done, known_outcome(ticket))
        if done.parked:
            hurry(self._consumer, done.parked, "a parked coalesced run")
        if holding.bucket in self.waiting:
            self.wake(holding.bucket)

    def _park_long_waits(self, now: float) -> None:
        """Park the waiting runs held here longer than ``extras_delay_max_hold``."""
        for bucket, waiting in list(self.waiting.items()):
            for ticket, holding in list(waiting):
                if now - holding.since < self.max_hold:
                    continue
                seconds = max(holding.run_due - (now - holding.asked), 0.0) + 0.005
                entry = self._pipeline.park_queued(ticket, "coalesce", seconds)
                if entry is None:
                    holding.since = now  # cannot park (no delay store, store down): held
                    continue
                self._unwait(bucket, ticket)
                self.counts["parked"] += 1
                self.holds.park_wait(bucket, ticket.request.id, holding.holder, entry,
                           seconds, holding.lease)  # fmt: skip

    def _discarded(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        """``task_revoked``: Celery discarded a message (revoked, expired). Were it the
        waiting run of its key (parked, so it never reached this gate), or a run between
        attempts, it goes, and what it covered resolves as it did (revoked)."""
        found = discarded_key(self.app, self.specs, sender, request, "coalesce")
        if found is None:
            return
        (bucket, task_id) = found
        dropped: CoalesceFinished | None = self.holds.drop(bucket, task_id)
        if dropped is not None:
            self._end_covered(bucket[0], task_id, dropped, revoked_outcome(task_id))

    def yielded(self, ticket: Ticket, seconds: float) -> None:
        holding = self.runs.pop(ticket)
        if holding is not None:
            self.runs.step_aside(ticket, holding, seconds)

    def stop(self) -> None:
        """Waiting runs are dropped (the broker delivers them again); runs that had not
        reached the pool keep their hold for whoever receives them next."""
        for bucket, waiting in list(self.waiting.items()):
            for ticket, holding in waiting:
                compat.forget_held(ticket.request)
                self.holds.forget(bucket, ticket.request.id, holding.holder)
        self.waiting.clear()
        self.endings.forget_here()
        self.runs.drop_unadmitted(self._pipeline.admitted if self._pipeline is not None else {})
        self.notices.stop()
        task_revoked.disconnect(dispatch_uid=f"coalesce.{id(self)}")

    # -- renewal -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Renew the holds due (every third of the lease), and ask again for the waiting runs
        due (their renewal): every :data:`ASK_AGAIN` seconds, or when the run's lease ends."""
        now = self.clock()
        self.runs.renew(now)
        for bucket, waiting in list(self.waiting.items()):
            if any(now >= holding.next_ask for _, holding in waiting):
                self.wake(bucket)
        self._park_long_waits(now)

    def queued(self) -> int:
        return sum(len(waits) for waits in self.waiting.values()) + len(self.endings.here)

    def info(self) -> dict[str, Any]:
        tasks = {name: {**spec.describe(), "running": 0, "waiting": 0}
                 for name, spec in self.specs.items()}  # fmt: skip
        for holding in self.runs.running():
            tasks[holding.bucket[0]]["running"] += 1
        for bucket, waiting in self.waiting.items():
            tasks[bucket[0]]["waiting"] += len(waiting)
        return {
            "tasks": tasks,
            **self.counts,
            "lost_holds": self.runs.lost,
            **{f"covered_{what}": count for what, count in self.endings.counts.items()},
            "store": "shared" if self.holds.shared else "worker",
            **self.health.info(),
            "on_store_error": self.on_store_error,
        }
