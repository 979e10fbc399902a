"""The one gate of every key-run policy (coalescing, debounce, memoize): what they share.

A key-run policy holds a key for its run, cluster-wide, and ends the messages the run covers
with its outcome. Each arriving message of a key asks the policy's holds (its Redis form, or
with no store this worker's table of its rules) what it does:

* **run**: it goes on to the next gates, then the pool; its hold is renewed every third of
  the lease until the pipeline hears it end, then freed (:meth:`KeyRunGate.ending`: what the
  policy's finish is told), and every message it covered ends as if it had run with its
  outcome (:mod:`~celery_extras.admission.covered`: result, callbacks, chain, chord part,
  signal). A run that ends in a retry keeps the hold for its retry; one parked by a later
  gate, or dropped with a lost connection, keeps it for whichever worker receives it next;
* **covered**: its message is acked and counted under the policy's counter (it takes no
  token and no slot); its ending context went to the holds with the verdict, so whichever
  worker ends the covering run ends it. Covered by a run that has ended already, it ends
  here with that run's stored outcome, then is acked;
* **wait**: it is held here (unacked, no pool slot, the prefetch window widened) and asks
  again when told (a release notice, its due time, at the latest every :data:`ASK_AGAIN`
  seconds: its renewal). Held longer than ``extras_delay_max_hold``, it is parked in the
  delay store (stored, then acked) until its wait ends; a run's end makes it due at once.

A policy is a subclass naming its :class:`KeyRules`, its pure table and Redis form
(``table``, ``store``) and what its holds are asked (:meth:`KeyRunGate.question`). While
the store cannot be reached, ``extras_<policy>_on_store_error`` says what a message does:
``'hold'`` waits (unacked) and asks again every ``extras_store_retry`` seconds, ``'run'``
runs unheld.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from celery import Celery
from celery.signals import task_revoked

from .. import compat
from ..admission.covered import CoveredEndings, context_of, encode_context
from ..admission.gate import COVERED, QUEUED, RUN, Answer, Gate, Hold, HolderIds, Ticket
from ..admission.handle import GateHandle
from ..admission.notices import Bucket, ReleaseNotices
from ..admission.policy import Policy
from ..admission.serial import serial
from ..admission.spec import call_key
from ..admission.store_round import NO_REPLY, StoreCall
from ..clock import monotonic, wall
from ..settings import Setting, choice
from ..store.client import store_user
from .endings import KeyEndings
from .held import Held, RunHolds, Waiting, per_task
from .holds import KeyRunHolds
from .owed import OwedEndings, Unfinished
from .purged import ParkedRuns
from .runs import discarded_key, known_outcome, revoked_outcome
from .table import KeyVerdict

__all__ = [
    "ASK_AGAIN",
    "LATE",
    "KeyRules",
    "KeyRunGate",
    "context_text",
    "key_run_policy",
    "on_store_error",
    "retries_of",
]

#: Longest a waiting message goes without asking again: it renews its hold, and runs soon
#: should a run's release notice be lost.
ASK_AGAIN = 1.0
#: Asked a little after a wait ends, so that the store (its clock) finds it ended.
LATE = 0.005


@dataclass(frozen=True)
class KeyRules:
    """What names a key-run policy in the worker: its *noun* (logs, the store's health), its
    stats *counter* (``coalesced``) and *verb* (``coalescing``), the *signal* a covered
    message sends, and the warning without a store (*alone*)."""

    noun: str
    counter: str
    verb: str
    signal: Any
    alone: str

    @property
    def consequence(self) -> dict[str, str]:
        """What an outage of the store means, by ``extras_<policy>_on_store_error``."""
        counter, verb = self.counter, self.verb
        return {"hold": f"{counter} tasks wait (unacked) until it answers",
                "run": f"{counter} tasks run without {verb} until it answers"}  # fmt: skip

    @property
    def parked(self) -> str:
        return f"a parked {self.counter} message"


def retries_of(request: Any) -> int:
    """The ``retries`` header of *request* (0 when absent or not an int)."""
    retries = (getattr(request.message, "headers", None) or {}).get("retries")
    return retries if isinstance(retries, int) and not isinstance(retries, bool) else 0


def context_text(ticket: Ticket, label: str) -> str:
    """*ticket*'s ending context as JSON text, encoded once (kept in its notes)."""
    note = f"{label}.context"
    context = ticket.notes.get(note)
    if context is None:
        context = ticket.notes[note] = encode_context(context_of(ticket.request))
    return str(context)


class KeyRunGate(KeyEndings, Gate):
    """The holds of one key-run policy in one worker's consumer, as a gate of its pipeline."""

    hears_endings = True
    rules: ClassVar[KeyRules]
    #: the policy's pure table, ``table(clock)``, and its Redis form, ``store(client, prefix)``
    table: ClassVar[type[Any]]
    store: ClassVar[type[Any]]
    #: seconds added to a parked wait (its store finds it ended)
    park_late: ClassVar[float] = LATE
    #: whether a waiting message asks again at its due time on a timer of its own
    timed_waits: ClassVar[bool] = False

    def __init__(self, app: Celery, settings: Mapping[str, Any],
                 clock: Callable[[], float] = monotonic,
                 wall: Callable[[], float] = wall) -> None:  # fmt: skip
        self.app, self.clock, self.wall = app, clock, wall
        self.logger = logging.getLogger(f"celery_extras.{self.label}")
        self.on_store_error: str = settings[f"{self.label}_on_store_error"]
        self.store_retry: float = settings["store_retry"]
        self.max_hold: float = settings["delay_max_hold"]
        self.specs: dict[str, Any] = {}
        self.health = store_user(app, self.logger, self.rules.noun,
                                 self.rules.consequence[self.on_store_error], clock)  # fmt: skip
        self.holds = self.make_holds(app, wall)
        self.holders = HolderIds()
        self.runs = RunHolds(self.holds.step_aside, self.holds.renew, self.label)
        self.waiting = Waiting()
        self.endings = CoveredEndings(app)
        self.owed = OwedEndings(self.holds, f"{self.holders.worker}:owed", clock)
        self.parked_runs = ParkedRuns(clock)
        self.notices = ReleaseNotices(self.wake, self.label)
        self.counts = {"runs": 0, self.rules.counter: 0, "waited": 0, "parked": 0, "unheld": 0}
        self.parks = True
        self._handle: Any = None
        self._consumer: Any = None

    # -- the policy's part ---------------------------------------------------------------------

    def make_holds(self, app: Celery, wall: Callable[[], float]) -> KeyRunHolds:
        """The policy's holds: its table, or its Redis form, through :attr:`health`."""
        return KeyRunHolds(app, self.health, type(self).table(wall), type(self).store)

    def question(self, ticket: Ticket, holding: Held) -> tuple[Any, ...]:
        """What the holds' ``ask`` is given after the bucket, for *ticket* now."""
        raise NotImplementedError

    def ending(self, ticket: Ticket) -> tuple[Any, ...]:
        """What the holds' ``finish`` is given after bucket, id and holder."""
        return ()

    # -- asking --------------------------------------------------------------------------------

    def handles(self, name: str) -> bool:
        return name in self.specs

    def register(self, name: str, policies: Any) -> None:
        spec = getattr(policies, self.label, None)
        if spec is not None:
            self.specs[name] = spec

    def start(self, handle: GateHandle, consumer: Any) -> None:
        self._handle, self._consumer = handle, consumer
        self.notices.start(consumer)
        task_revoked.connect(serial(consumer).wrap(self._discarded), weak=False,
                             dispatch_uid=f"{self.label}.{id(self)}")  # fmt: skip
        if self.specs and not self.holds.shared:
            self.logger.warning("celery-extras: no store (extras_redis_url, or a Redis broker): "
                                "%s", self.rules.alone)  # fmt: skip

    def _new(self, ticket: Ticket) -> Held:
        spec = self.specs[ticket.name]
        key = call_key(ticket.name, spec.key, ticket.request, self.label, "key", self.logger)
        holder = ticket.holder(self.label, self.holders)
        return Held((ticket.name, key), holder, spec.lease, self.clock())

    def _question(self, ticket: Ticket, holding: Held) -> tuple[Any, ...]:
        holding.asked = self.clock()
        return self.question(ticket, holding)

    def arrival_call(self, ticket: Ticket) -> StoreCall | None:
        """The store's ask, when the holds are the store's and it may answer (hold noted)."""
        if not self.holds.joins_rounds():
            return None
        holding = ticket.notes[self.label] = self._new(ticket)
        return self.holds.ask_call(holding.bucket, *self._question(ticket, holding),
                                   may_wait=True)  # fmt: skip

    def admit(self, ticket: Ticket) -> Answer:
        holding = ticket.notes.pop(self.label, None) or self._new(ticket)
        reply = ticket.reply(self.label)  # the round's, asked as arrival_call put it
        verdict = (self.holds.asked(reply) if reply is not NO_REPLY else
                   self.holds.ask(holding.bucket, *self._question(ticket, holding)))  # fmt: skip
        if verdict is None:
            if self.on_store_error == "run":
                self.counts["unheld"] += 1
                return RUN
            return Hold(self.store_retry)
        return self._answer(ticket, holding, verdict, queued=False)

    def _answer(self, ticket: Ticket, holding: Held, verdict: KeyVerdict, queued: bool) -> Answer:
        if verdict.kind == "run":
            self.counts["runs"] += 1
            self.runs.add(ticket, holding)
            return RUN
        if verdict.kind == "covered":
            self.counts[self.rules.counter] += 1
            self.rules.signal.send(sender=ticket.name, request=ticket.request, by=verdict.by)
            if verdict.ended:  # by a run that has ended: it ends here, then is acked
                return self._end_here(ticket, holding, verdict.by)
            return COVERED
        holding.due = verdict.due  # asked again then, and at the latest every ASK_AGAIN s
        holding.next_ask = holding.asked + min(ASK_AGAIN, holding.lease / 3, verdict.due + LATE)
        if not queued:
            holding.since = holding.asked
            self.counts["waited"] += 1
            self.waiting.add(ticket, holding)
            self.holds.listen(self.notices)
        if self.timed_waits and self._consumer is not None:  # on time, between two ticks
            delay = max(holding.next_ask - self.clock(), 0.0)
            serial(self._consumer).call_after(delay, self.ask_due)
        return QUEUED

    def ask_due(self) -> None:
        """Ask again for the waiting messages whose wait has ended."""
        for bucket in self.waiting.due(self.clock()):
            self.wake(bucket, due_only=True)

    def next_due(self) -> float | None:
        """When a waiting message next asks again on a timer of its own (``timed_waits``:
        simulated time moves to it), or ``None``."""
        return self.waiting.next_due() if self.timed_waits else None

    def run_due(self) -> None:
        self.ask_due()

    def wake(self, bucket: Bucket, due_only: bool = False) -> None:
        """Ask again for the waiting messages of *bucket* (every bucket for :data:`ALL`): a run
        of it ended (or, *due_only*, those whose wait ended)."""
        now = self.clock()
        for one, ticket, holding in self.waiting.named(bucket):
            if due_only and now < holding.next_ask:
                continue
            verdict = self.holds.ask(holding.bucket, *self._question(ticket, holding))
            if verdict is None:
                holding.next_ask = holding.asked + self.store_retry
                continue
            answer = self._answer(ticket, holding, verdict, queued=True)
            if answer is not QUEUED or (verdict.kind == "covered" and verdict.ended):
                self.waiting.remove(one, ticket)  # (covered by an ended run: ending here)
                if answer is not QUEUED:
                    self._handle.resume(ticket, answer)

    # -- endings -------------------------------------------------------------------------------

    def ending_call(self, ticket: Ticket) -> StoreCall | None:
        """The store's finish of a run that ended (not retrying), if the store may answer."""
        holding = self.runs.get(ticket)
        if holding is None or ticket.retry_in is not None or not self.holds.joins_rounds():
            return None
        return self.holds.finish_call(holding.bucket, ticket.request.id, holding.holder,
                                      *self.ending(ticket),
                                      may_wait=holding.bucket not in self.waiting)  # fmt: skip

    def finished(self, ticket: Ticket) -> None:
        """The run ended: its key freed (or kept for its retry), its outcome copied to what
        it covered; this worker's waiting message of the key asks at once."""
        holding = self.runs.pop(ticket)
        if holding is None:
            return
        if ticket.retry_in is not None:
            self.runs.step_aside(ticket, holding, ticket.retry_in)
            return
        run = Unfinished(holding.bucket, ticket.request.id, holding.holder,
                         self.ending(ticket), known_outcome(ticket))  # fmt: skip
        done = self.holds.finish(run.bucket, run.run_id, run.holder, *run.ending,
                                 reply=ticket.reply(self.label))  # fmt: skip
        if done is None:  # unanswered (the store may have done it): asked again at each tick
            self.owed.retry(run)
            return
        self._finished(run, done)

    def _park_long_waits(self, now: float) -> None:
        """Park what waits here over ``extras_delay_max_hold``, for what is left of its wait."""
        for bucket, ticket, holding in self.waiting.held_since(now - self.max_hold):
            seconds = max(holding.due - (now - holding.asked), 0.0) + self.park_late
            entry = (self._handle.park(ticket, self.label, seconds)
                     if self.parks else None)  # fmt: skip
            if entry is None:
                holding.since = now  # cannot park (no delay store, store down): held
                continue
            self.waiting.remove(bucket, ticket)
            self.counts["parked"] += 1
            self._parked(bucket, ticket.request.id, holding, entry, seconds)

    def _discarded(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        """``task_revoked``: were the message discarded its key's waiting one, or a run between
        attempts, it goes, and what it covered ends as it did (revoked)."""
        found = discarded_key(self.app, self.specs, sender, request, self.label)
        if found is None:
            return
        (bucket, task_id) = found
        dropped = self.holds.drop(bucket, task_id)
        if dropped is not None:
            self._end_covered(bucket[0], task_id, dropped, revoked_outcome(task_id))

    def yielded(self, ticket: Ticket, seconds: float) -> None:
        holding = self.runs.pop(ticket)
        if holding is not None:
            self.runs.step_aside(ticket, holding, seconds)

    def stop(self) -> None:
        """Waiting messages are dropped (the broker delivers them again); runs not in the
        pool keep their hold for whoever receives them next."""
        for bucket, ticket, holding in self.waiting.take_all():
            compat.forget_held(ticket.request)
            self.holds.forget(bucket, ticket.request.id, holding.holder)
        self.endings.forget_here()
        self.owed.finish_again(self._finished, now=True)
        if self._handle is not None:
            self.runs.drop_unadmitted(self._handle.in_pool)
        self.notices.stop()
        task_revoked.disconnect(dispatch_uid=f"{self.label}.{id(self)}")

    # -- renewal -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Renew the runs' holds due, ask again for the waiting due, park those held long."""
        now = self.clock()
        self.runs.renew(now)
        if self.specs:  # a worker without the policy's tasks has nothing to end
            self.owed.tick(self._finished, self._end_owed)
        self.ask_due()
        self._park_long_waits(now)
        self._end_purged()

    def queued(self) -> int:
        return len(self.waiting) + len(self.endings.here)

    def info(self) -> dict[str, Any]:
        return {
            "tasks": per_task(self.specs, self.runs.running(), self.waiting),
            **self.counts,
            "lost_holds": self.runs.lost,
            **{f"covered_{what}": count for what, count in self.endings.counts.items()},
            **{f"owed_{what}": count for what, count in self.owed.counts.items()},
            "holds": "shared" if self.holds.shared else "worker",
            **self.health.info(),
            "on_store_error": self.on_store_error,
        }


def on_store_error(policy: str, verb: str, promise: str) -> Setting[str]:
    """The setting ``extras_<policy>_on_store_error`` of a key-run policy (*verb*: what it
    does, ``coalescing``; *promise*: what ``'hold'`` keeps besides every message)."""
    return Setting(
        f"{policy}_on_store_error",
        "hold",
        choice("hold", "run"),
        "str",
        f"What a ``{policy}()`` task does while the store cannot be reached (or may evict its "
        f"holds): ``'hold'`` keeps each message waiting (unacked, never lost{promise}) and "
        f"asks the store again every ``extras_store_retry`` seconds; ``'run'`` runs every "
        f"message without {verb} (availability first). Logged once per outage.",
    )


def key_run_policy(gate: type[KeyRunGate], *, parks: bool = False,
                   connect: Callable[[Celery], None] | None = None,
                   promise: str = ", never two runs of a key at once") -> Policy:  # fmt: skip
    """The entry of a key-run policy named after its *gate*'s label: its decorator, gate,
    ``info()`` key and its ``extras_<policy>_on_store_error`` setting (see
    :class:`~celery_extras.admission.policy.Policy` for *parks* and *connect*)."""
    name = gate.label
    return Policy(name=name, decorator=f"{name}()", gate=gate, info_key=name, parks=parks,
                  connect=connect,
                  settings=(on_store_error(name, gate.rules.verb, promise),))  # fmt: skip
