"""The admission pipeline: the one path a task with a policy takes in the worker's main
process, from its arrival to the pool, and back when it ends.

Each arriving request (or one whose ETA passed) gets a :class:`~.gate.Ticket` and
is asked of its task's gates in order (:attr:`Pipeline.gates`, e.g. the limit, then
the concurrency slot). A gate answers :data:`~.gate.RUN` (on to the next),
:class:`~.gate.Hold` (this pipeline holds it in the worker's timer, or parks it in
the delay store when the gate allows and the wait is long, then asks the same gate
again), :data:`~.gate.QUEUED` (the gate keeps it and calls :meth:`Pipeline.resume`) or
:data:`~.gate.COVERED` (another run does its work: its message is acked).
After the last gate the request is reserved and handed to the pool with the
:mod:`request hook <.request_hook>`, through which the gates that asked hear once
how it ended. Held or queued messages stay unacked: a worker killed meanwhile loses
none, the broker delivers them again. Every entry (an arrival, an ending, a tick, a
timer's due hold, a round's reply) runs under the consumer's :class:`~.serial.Serial`,
whatever thread or greenlet it comes from; a request goes to the pool once it is let go.

On a green pool (gevent, eventlet) an ending is heard in the ending task's own greenlet,
and a slot it frees resumes the next waiting request there: handed to the pool from that
greenlet, it would wait in the pool's ``spawn`` for a free slot, the ending greenlet's own
(gevent's worker froze; eventlet's ``spawn`` runs it in place, inside the ending task, one
stack deeper for each). A resumed request goes to a green pool from a greenlet of the
worker's timer instead (:meth:`Pipeline.hand`); one whose handover a stop or a lost
connection overtook goes back to the broker, unacked, and its gates free what they hold
for it (as for a retry in 0 s).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery import states

from .. import compat
from ..delay.parking import Park
from .covered import CoveredMessage, Outcome, context_of, end_covered
from .gate import COVERED, QUEUED, RUN, Answer, Gate, Hold, Refuse, Ticket
from .handle import GateHandle
from .request_hook import request_hook
from .rounds import Rounds
from .serial import Serial, serial
from .waits import TimerHolds, park_message

__all__ = [
    "IN_DOUBT",
    "PARK_AGAIN",
    "PIPELINE_ATTR",
    "RESUMED",
    "TICK",
    "AdmissionRefused",
    "Pipeline",
]

logger = logging.getLogger(__name__)

#: Attribute of the consumer holding its :class:`Pipeline`.
PIPELINE_ATTR = "extras_admission"
#: Seconds between the pipeline's ticks (gates renew leases, endings unseen are found).
TICK = 0.25
#: Seconds between the parks of a message whose park the store left in doubt
PARK_AGAIN = 1.0
#: :attr:`Ticket.notes` key of the wait a park in doubt was for
IN_DOUBT = "park.in_doubt"
#: :attr:`Ticket.notes` key of a request a gate resumed (:meth:`Pipeline.resume`)
RESUMED = "pipeline.resumed"


class AdmissionRefused(Exception):
    """A task its gates can never admit (a cost above its limit's burst): its failure."""


class _Resuming:
    """:class:`Pipeline`'s resume path: a gate lets a request it kept waiting go on. On a
    green pool the request goes to the pool from a greenlet of the worker's timer, never
    from the caller's (maybe the greenlet of a task whose ending freed the slot)."""

    serial: Serial
    #: resumed requests on their way to a green pool, by ``id(request)`` (:meth:`hand`)
    handing: dict[int, Ticket]
    admitted: dict[int, Ticket]

    def _advance(self, ticket: Ticket) -> None:
        raise NotImplementedError

    def _covered(self, ticket: Ticket) -> None:
        raise NotImplementedError

    def _hear(self, ticket: Ticket) -> None:
        raise NotImplementedError

    def resume(self, ticket: Ticket, answer: Answer = RUN) -> None:
        """The gate that queued *ticket* answers now: :data:`~.gate.RUN` (on to the next
        gate) or :data:`~.gate.COVERED`."""
        with self.serial:
            compat.narrow_prefetch(ticket.consumer)
            if answer is COVERED:
                self._covered(ticket)
                return
            ticket.stage += 1
            ticket.notes[RESUMED] = True
            self._advance(ticket)

    def _deferred(self, ticket: Ticket) -> bool:
        """``True`` when *ticket*, resumed, goes to a green pool later (:meth:`hand`)."""
        if not (ticket.notes.pop(RESUMED, False) and _green(ticket.consumer)):
            return False
        self.handing[id(ticket.request)] = ticket
        ticket.consumer.timer.call_after(0, self.hand, (ticket,), priority=6)
        return True

    def hand(self, ticket: Ticket) -> None:
        """Hand resumed *ticket* to the green pool, in a greenlet of the worker's timer (not
        the pool's: its ``spawn`` may wait for a slot), outside the lock; unless a stop
        dropped it, or began (as Celery's loop sees it a turn late): :meth:`stop` drops it."""
        with self.serial:
            if id(ticket.request) not in self.handing or compat.worker_stopping():
                return
            del self.handing[id(ticket.request)]
        try:
            ticket.consumer.on_task_request(ticket.request)
        except Exception:  # as Serial.after: logged (Celery's own handover logs its errors)
            logger.exception("celery-extras: handing %s[%s] over failed", ticket.name,
                             getattr(ticket.request, "id", "?"))  # fmt: skip

    def _drop_handing(self) -> None:
        """Stopping: resumed requests not handed to the pool yet go back to the broker
        (unacked); the gates they passed free what they hold for them, as for a retry
        in 0 s (a key run's hold stays for its message's next delivery)."""
        for key, ticket in list(self.handing.items()):
            del self.handing[key]
            self.admitted.pop(key, None)
            compat.reserved_requests().discard(ticket.request)
            compat.forget_held(ticket.request)
            ticket.retry_in, ticket.outcome = 0.0, None
            self._hear(ticket)


class Pipeline(_Resuming):
    """One consumer's gates, in order, and the requests between them."""

    def __init__(self, gates: Sequence[Gate]) -> None:
        self.gates = tuple(gates)
        self.chains: dict[str, tuple[Gate, ...]] = {}
        #: tasks with a gate that hears how each request ended
        self.heard: set[str] = set()
        self.holds = TimerHolds()
        #: requests in the pool that a gate must hear the end of, by ``id(request)``
        self.admitted: dict[int, Ticket] = {}
        self.handing: dict[int, Ticket] = {}  # resumed, on their way to a green pool
        self.epoch = 0  # stop() counts the connections lost
        self._tick_entry: Any = None
        #: per task, the gates whose store calls go in one round: as it arrives, and as it ends
        self.arrival_rounds: dict[str, tuple[Gate, ...]] = {}
        self.ending_rounds: dict[str, tuple[Gate, ...]] = {}
        self.rounds = Rounds()
        #: the consumer's lock around this path (:meth:`start` gives the consumer's own)
        self.serial = Serial(None)
        #: the delay store's arrival gate (its parker parks waits): :meth:`start` is given it
        self.arrival: Any = None
        self._answered, self._heard = self._onward, self._hear  # a round's reply: locked

    def gate(self, label: str) -> Any:
        return next(g for g in self.gates if g.label == label)

    # -- set-up ------------------------------------------------------------------------------

    def register(self, name: str, policies: Any) -> bool:
        """A strategy of task *name* is built: ``True`` when any gate handles it."""
        for gate in self.gates:
            gate.register(name, policies)
        chain = self.chains[name] = tuple(g for g in self.gates if g.handles(name))
        if any(gate.hears_endings for gate in chain):
            self.heard.add(name)
        else:
            self.heard.discard(name)
        listening = tuple(gate for gate in chain if gate.hears_endings)
        _join(self.arrival_rounds, name, _leading(chain, "arrival_call"))
        _join(self.ending_rounds, name, _leading(listening, "ending_call"))
        return bool(chain)

    def start(self, consumer: Any, arrival: Any = None) -> None:
        """*consumer* started (or restarted after a lost connection); *arrival*: the delay
        store's arrival gate, when the worker parks (``None``: waits are held here)."""
        self.serial, self.arrival = serial(consumer), arrival
        self._answered, self._heard = self.serial.wrap(self._onward), self.serial.wrap(self._hear)
        hook = request_hook(consumer)
        hook.listen(finish=self.finished)
        hook.forget()  # the request classes of the strategies Celery built for a lost connection
        self.rounds.start(consumer)
        handle = GateHandle(self, consumer)
        for gate in self.gates:
            gate.start(handle, consumer)
        if self._tick_entry is None:
            self._tick_entry = consumer.timer.call_repeatedly(
                TICK, self.serial.wrap(self.tick), priority=6
            )

    def stop(self) -> None:
        """Connection lost or shutting down: waiting requests are dropped (the broker
        delivers their messages again); running ones keep what they hold until they end.
        Rounds on the line are answered first, as if they had been calls."""
        with self.serial:
            self.rounds.close()
            self.epoch += 1  # ETA timers of the lost connection must not run its tasks
            self.holds.drop_all()
            for gate in self.gates:
                gate.stop()
            self._drop_handing()
        if self._tick_entry is not None:
            self._tick_entry.cancel()
            self._tick_entry = None

    # -- the path ----------------------------------------------------------------------------

    def submit(self, consumer: Any, request: Any, name: str) -> None:
        """A request of task *name* arrived, or its ETA passed."""
        slot = self.arrival.pop_slot(request.id) if self.arrival is not None else None
        with self.serial:
            self._advance(Ticket(request, name, consumer, released_slot=slot))

    def _advance(self, ticket: Ticket) -> None:
        arrival = self.arrival_rounds.get(ticket.name) if ticket.stage == 0 else None
        if arrival and self.rounds.send(ticket, arrival, "arrival_call", self._answered):
            return  # on the line: the gates are asked as its reply comes
        self._onward(ticket)

    def _onward(self, ticket: Ticket) -> None:
        """Ask *ticket*'s gates from its stage on; every reply of its round must be read."""
        self._ask(ticket, self.chains[ticket.name])
        if ticket.replies:
            _unread(ticket)

    def _ask(self, ticket: Ticket, chain: tuple[Gate, ...]) -> None:
        """Ask *ticket*'s gates from its stage on, until one keeps it or it goes to the pool."""
        while ticket.stage < len(chain):
            gate = chain[ticket.stage]
            answer = gate.admit(ticket)
            if answer is RUN:
                ticket.stage += 1
            elif answer is QUEUED:
                compat.widen_prefetch(ticket.consumer)
                return
            elif answer is COVERED:
                self._covered(ticket)
                return
            elif isinstance(answer, Refuse):
                _refuse(ticket, answer.error)
                return
            else:
                assert isinstance(answer, Hold)
                self._wait(ticket, gate, answer)
                return
        self._go(ticket)

    def _go(self, ticket: Ticket) -> None:
        request = ticket.request
        if ticket.name in self.heard:
            self.admitted[id(request)] = ticket
            request_hook(ticket.consumer).adopt(request)
        compat.task_reserved(request)
        if not self._deferred(ticket):  # once the lock is let go: a green pool's spawn
            self.serial.after(ticket.consumer.on_task_request, request)  # waits for a slot

    def park_queued(self, ticket: Ticket, kind: str, seconds: float) -> str | None:
        """Park *ticket*, queued in a gate, in the delay store for *seconds* (its message
        stored, then acked): its entry's id, or ``None`` (still queued) when it cannot be
        parked."""
        if self.arrival is None:
            return None
        parked, entry = park_message(self.arrival, ticket.request, ticket.name, kind, seconds)
        if not parked:
            return None
        compat.narrow_prefetch(ticket.consumer)
        self._left(ticket, seconds)
        return entry

    def _covered(self, ticket: Ticket) -> None:
        """Another run does *ticket*'s work: ack its message, forget the request."""
        compat.forget_held(ticket.request)
        ticket.request.acknowledge()

    def _wait(self, ticket: Ticket, gate: Gate, hold: Hold) -> None:
        """Hold *ticket* in the timer for the wait *gate* asked, or park it. A park whose
        outcome the store left in doubt is tried again every :data:`PARK_AGAIN` seconds, the
        message held meanwhile, until the store says it is parked: were it run here, the
        copy the store may hold would run too."""
        delay = hold.seconds if hold.due is None else hold.due - gate.clock()
        parked = Park.KEPT
        if hold.park is not None and self.arrival is not None:
            parked, _ = park_message(self.arrival, ticket.request, ticket.name, hold.park,
                                     max(delay, 0.0))  # fmt: skip
        if parked:
            ticket.notes.pop(IN_DOUBT, None)
            gate.held(ticket, hold, parked=True)
            self._left(ticket, delay)
            return
        doubt = parked is Park.IN_DOUBT or IN_DOUBT in ticket.notes
        if doubt:
            ticket.notes[IN_DOUBT] = hold
        key = id(ticket.request)
        self.holds.hold(ticket.consumer, key, PARK_AGAIN if doubt else hold.seconds,
                        self._held_due, (ticket,), request=ticket.request)  # fmt: skip
        if not doubt:
            gate.held(ticket, hold, parked=False)

    def _left(self, ticket: Ticket, seconds: float) -> None:
        """*ticket* left this worker before running: the gates it passed that hear endings
        are told (what they hold for it waits for it elsewhere)."""
        for gate in self.chains[ticket.name][: ticket.stage]:
            if gate.hears_endings:
                gate.yielded(ticket, seconds)

    def _held_due(self, ticket: Ticket) -> None:
        with self.serial:
            if not self.holds.release(ticket.consumer, id(ticket.request)):
                return  # dropped by stop()
            doubt = ticket.notes.get(IN_DOUBT)
            if doubt is not None:  # parked again, not asked again
                self._wait(ticket, self.chains[ticket.name][ticket.stage], doubt)
                return
            self._advance(ticket)  # the same gate is asked again

    # -- endings -----------------------------------------------------------------------------

    def finished(self, request: Any, retry_in: float | None = None, outcome: Any = None) -> None:
        """*request* ended (any way; *retry_in*: the seconds until its retry, if it raised
        ``Retry``; *outcome*: how, as the request hook saw it): the gates it passed that
        listen hear it, once."""
        with self.serial:
            self._finished(request, retry_in, outcome)

    def _finished(self, request: Any, retry_in: float | None, outcome: Any) -> None:
        ticket = self.admitted.pop(id(request), None)
        if ticket is None:
            return
        if ticket.request is not request:  # another request at a reused address
            self.admitted[id(request)] = ticket
            return
        ticket.retry_in, ticket.outcome = retry_in, outcome
        ending = self.ending_rounds.get(ticket.name)
        if ending and self.rounds.send(ticket, ending, "ending_call", self._heard):
            return  # on the line: the gates hear it as its reply comes
        self._hear(ticket)

    def _hear(self, ticket: Ticket) -> None:
        """The gates *ticket* passed that listen hear its end; every reply must be read."""
        for gate in self.chains[ticket.name]:
            if gate.hears_endings:
                gate.finished(ticket)
        if ticket.replies:
            _unread(ticket)

    def ended(self, ticket: Ticket, retry_in: float | None = None, outcome: Any = None) -> None:
        """*ticket*, kept by a gate that ran it itself (a batch), ended: the gates before
        that one that listen hear it, once."""
        ticket.retry_in, ticket.outcome = retry_in, outcome
        for gate in self.chains[ticket.name][: ticket.stage]:
            if gate.hears_endings:
                gate.finished(ticket)

    def waiting(self) -> int:
        """Requests waiting here, unacked: held in the timer or queued in a gate."""
        return len(self.holds) + sum(gate.queued() for gate in self.gates)

    def tick(self) -> None:
        """Find requests Celery forgot without an ending the hook heard, then let each
        gate do its periodic work (lease renewals)."""
        for ticket in list(self.admitted.values()):
            if compat.request_pending(ticket.request):
                ticket.unseen = 0
                continue
            ticket.unseen += 1
            if ticket.unseen >= 2:  # gone for two ticks in a row
                self._finished(ticket.request, _forgotten(ticket), None)
        self.rounds.tick()
        for gate in self.gates:
            gate.tick()


def _forgotten(ticket: Ticket) -> float | None:
    """How the gates hear of a request Celery forgot without a callback the hook heard (its
    ``retry_in``). One that started ended unseen (``None``): its gates free what they hold.
    One that never started was dropped before the pool took it (a lost connection or a stop
    clears the semaphore's waiting list), and its unacked message comes again: a retry in
    0 s (a key run's hold waits for that delivery; what it covered is not ended)."""
    task = f"{ticket.name}[{getattr(ticket.request, 'id', '?')}]"
    if getattr(ticket.request, "time_start", None):
        logger.warning("celery-extras: %s ended unseen; freeing what its gates hold", task)
        return None
    logger.info("celery-extras: %s was dropped before it ran; its message comes again", task)
    return 0.0


def _green(consumer: Any) -> bool:
    """Whether *consumer*'s pool is green (gevent, eventlet)."""
    return bool(getattr(getattr(consumer, "pool", None), "is_green", False))


def _leading(gates: tuple[Gate, ...], asker: str) -> tuple[Gate, ...]:
    """The first of *gates* up to the first that does not hand its calls over as data
    (its *asker* is :class:`~.gate.Gate`'s own)."""
    leading = []
    for gate in gates:
        if getattr(type(gate), asker) is getattr(Gate, asker):
            break
        leading.append(gate)
    return tuple(leading)


def _refuse(ticket: Ticket, error: str) -> None:
    """*ticket* can never pass a gate: it fails with :class:`AdmissionRefused`, as a task
    that raised it would (result, errbacks, the rest of its chain and its chord part
    failed, ``task_failure``, event: :func:`~.covered.end_covered`'s failure), and its
    message is acked."""
    logger.error("celery-extras: %s[%s] refused: %s", ticket.name, ticket.request.id, error)
    request, exc = ticket.request, AdmissionRefused(error)
    compat.forget_held(request)
    try:
        ending = CoveredMessage(request.id, context_of(request))
        failed = Outcome(states.FAILURE, exc, None, request.id)
        end_covered(request.task.app, ticket.name, ending, failed)
        request.send_event("task-failed", exception=repr(exc), traceback="")
    except Exception:  # a result backend that fails: the message still goes
        logger.exception("celery-extras: could not store the failure of %s", request.id)
    request.acknowledge()


def _unread(ticket: Ticket) -> None:
    """A gate answered without reading the round's reply to its call (a call its
    predicate let run although the gate before it did not let the task on): logged, as
    the store did what that call asks."""
    logger.error(
        "celery-extras: %s[%s]: store replies unread by gates %s (a bug: their calls' "
        "predicates do not match their gates' answers)",
        ticket.name, ticket.request.id, ", ".join(sorted(ticket.replies)),
    )  # fmt: skip
    ticket.replies.clear()


def _join(rounds: dict[str, tuple[Gate, ...]], name: str, gates: tuple[Gate, ...]) -> None:
    if gates:
        rounds[name] = gates
    else:
        rounds.pop(name, None)
