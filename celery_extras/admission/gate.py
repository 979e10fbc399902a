"""What a gate of the admission pipeline is: the question it answers, and what it hears.

A gate answers one question for an arriving request: :data:`RUN` (go on to the next
gate, then the pool), :class:`Hold` (come back in *seconds*, in the worker's timer or
parked in the delay store), :data:`QUEUED` (the gate keeps the request and resumes
it itself, as a slot frees), :data:`COVERED` (another run does this message's work:
it is acked and never runs) or :class:`Refuse` (it can never pass: it fails at once).
A gate that let a request through and asked to hear how it ended
(:attr:`Gate.hears_endings`) is told once, whatever the ending, or that the request
left this worker before running (:meth:`Gate.yielded`).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..clock import monotonic
from .store_round import NO_REPLY, StoreCall

__all__ = [
    "COVERED",
    "QUEUED",
    "RUN",
    "Answer",
    "Covered",
    "Gate",
    "GateFactory",
    "Hold",
    "HolderIds",
    "Queued",
    "Refuse",
    "Run",
    "Ticket",
]


class Run:
    """Go on: to the next gate, or to the pool after the last."""

    def __repr__(self) -> str:
        return "RUN"


class Queued:
    """The gate keeps the request and resumes it itself (:meth:`GateHandle.resume`)."""

    def __repr__(self) -> str:
        return "QUEUED"


class Covered:
    """Another run does this message's work: the pipeline acks it; it never runs."""

    def __repr__(self) -> str:
        return "COVERED"


RUN = Run()
QUEUED = Queued()
COVERED = Covered()


@dataclass(frozen=True)
class Refuse:
    """The request can never pass this gate: it fails at once with *error* (its message
    is acked, its result is a failure naming the task and the reason)."""

    error: str


@dataclass(frozen=True)
class Hold:
    """Ask this gate again in *seconds*.

    *park* names the kind of a delay-store entry (``"limit"``) when the wait may be
    parked there instead of held in the worker's timer; *due* (on the gate's clock) is
    when the wait ends, so time spent before parking is taken off the parked wait.
    """

    seconds: float
    park: str | None = None
    due: float | None = None


Answer = Run | Hold | Queued | Covered | Refuse


@dataclass(eq=False)
class Ticket:
    """One request on its way through the pipeline: where it is, and what gates noted."""

    request: Any
    name: str
    consumer: Any
    #: index of the gate asked next
    stage: int = 0
    #: what each gate keeps about this request (its booked slot, its grant), by gate label
    notes: dict[str, Any] = field(default_factory=dict)
    #: the due time of a slot booked before the request was parked (verified on release),
    #: and the index of the limit it was booked in (``None``: every limit)
    released_slot: tuple[float, int | None, frozenset[int]] | None = None
    #: ticks of the pipeline that found the running request gone from Celery's state
    unseen: int = 0
    #: how it ended: ``None``, or the seconds until its retry when it raised ``Retry``
    retry_in: float | None = None
    #: how it ended, as the main process saw it: ``True`` (returned), the exception it
    #: raised, or ``None`` (not known: killed, revoked)
    outcome: Any = None
    #: what the store answered the calls gates handed to one round (by gate label): a
    #: reply, or the exception the round raised (see :mod:`.store_round`)
    replies: dict[str, Any] = field(default_factory=dict)
    #: the id each gate's store holds this request under, by gate label (see :meth:`holder`)
    holders: dict[str, str] = field(default_factory=dict)

    def holder(self, label: str, new: Callable[[], str]) -> str:
        """Gate *label*'s holder id for this delivery (made by *new* on first use): every ask
        of the delivery is made under it, so an ask that failed after the store did it (a
        reply lost to a timeout) is asked again as the same holder, which the store knows,
        not as another (coalescing would find the message covered by its own lost run)."""
        holder = self.holders.get(label)
        if holder is None:
            holder = self.holders[label] = new()
        return holder

    def reply(self, label: str) -> Any:
        """The round's reply to gate *label*'s call (taken: read once), or :data:`NO_REPLY`."""
        return self.replies.pop(label, NO_REPLY) if self.replies else NO_REPLY


class HolderIds:
    """The holder ids one gate of a worker gives the deliveries it holds for: the gate's
    random id (:attr:`worker`, its name in the store) and a count, unique across the
    cluster and restarts without a random draw per delivery."""

    def __init__(self) -> None:
        self.worker = uuid.uuid4().hex[:16]
        self._count = itertools.count(1)

    def __call__(self) -> str:
        return f"{self.worker}:{next(self._count):x}"


class Gate:
    """Base of the pipeline's gates: one policy, asked in order for each request."""

    #: names the gate in ``inspect stats`` and in :attr:`Ticket.notes`
    label: ClassVar[str] = "gate"
    #: ``True`` when :meth:`finished` must be called as each admitted request ends
    hears_endings: ClassVar[bool] = False
    #: the clock of the gate's answers (:attr:`Hold.due`)
    clock: Callable[[], float] = staticmethod(monotonic)

    def queued(self) -> int:
        """Requests this gate keeps waiting (:data:`QUEUED`), unacked."""
        return 0

    def handles(self, name: str) -> bool:
        """Whether tasks of *name* pass this gate."""
        raise NotImplementedError

    def register(self, name: str, policies: Any) -> None:
        """A strategy of task *name* was built: read its policy from *policies*."""

    def start(self, handle: Any, consumer: Any) -> None:
        """The consumer started (or restarted after a lost connection): *handle* is what the
        gate may ask of the pipeline (:class:`~.handle.GateHandle`)."""

    def admit(self, ticket: Ticket) -> Answer:
        """Answer for *ticket*; a reply to :meth:`arrival_call` is :meth:`Ticket.reply`."""
        raise NotImplementedError

    def arrival_call(self, ticket: Ticket) -> StoreCall | None:
        """The store call :meth:`admit` makes first for an arriving *ticket*, as data (what
        it chose for the call, such as a holder id, kept in the ticket's notes), so that the
        pipeline makes it in one round with the other gates' calls; ``None`` when it would
        make none, or none known before it is asked; :data:`~.store_round.PASSES` when
        :meth:`admit` answers :data:`RUN` without asking the store. Its predicate must say
        what :meth:`admit` answers: it passes exactly when :meth:`admit` answers :data:`RUN`."""
        return None

    def ending_call(self, ticket: Ticket) -> StoreCall | None:
        """The store call :meth:`finished` makes for *ticket*, as data (as
        :meth:`arrival_call`), so that the endings of a task's gates are one round trip."""
        return None

    def held(self, ticket: Ticket, answer: Hold, parked: bool) -> None:
        """The pipeline held *ticket* in the timer, or parked it, as *answer* asked."""

    def finished(self, ticket: Ticket) -> None:
        """*ticket*'s request ended (any way) after this gate let it through."""

    def yielded(self, ticket: Ticket, seconds: float) -> None:
        """*ticket*'s request left this worker after this gate let it through, before it ran:
        a later gate parked it for *seconds*, or the connection was lost (the broker
        delivers it again). Called on the gates that hear endings."""

    def tick(self) -> None:
        """Called a few times a second from the event loop."""

    def next_due(self) -> float | None:
        """When this gate next needs time to pass to do what it keeps waiting (its clock),
        or ``None``: the testing plugin moves simulated time there, then calls
        :meth:`run_due`."""
        return None

    def run_due(self) -> None:
        """Do what has come due (called on the worker's loop after time moved)."""

    def busy(self) -> str:
        """What this gate is running that the worker must finish before it is idle (the
        testing plugin waits for it), or ``""``."""
        return ""

    def stop(self) -> None:
        """Connection lost or shutting down: drop what waits (the broker delivers it again)."""

    def info(self) -> dict[str, Any]:
        return {}


#: What builds a gate for a consumer: ``factory(app, settings)`` (a gate class).
GateFactory = Callable[[Any, Mapping[str, Any]], Gate]
