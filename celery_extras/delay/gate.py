"""The worker's arrival path of the delay store: the arrival gate.

:class:`ArrivalGate` sees every task message before its strategy. A message a
mover published (header ``extras_parked``) takes its entry in the store first:
a duplicate, or a copy of an entry purged meanwhile (``celery purge``), is acked
and dropped, a message whose entry, task or claim token the store does not know
is an ordinary message (no booked slot: a forged header buys nothing), and a
limited task that took its entry keeps its booked slot for the limits
(:meth:`ArrivalGate.pop_slot`). With ``extras_eta_store``, a message whose ETA is
further away than ``extras_eta_threshold`` is parked and only then acked. While
the store cannot answer, such messages wait in the worker's timer, unacked. The
mover thread, which publishes the parked entries, is in :mod:`.mover_thread`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery.utils.time import maybe_iso8601

from ..admission.waits import TimerHolds
from ..clock import monotonic
from ..clock import wall as clock_wall
from .entry import CLAIM_HEADER, PARKED_HEADER
from .parking import STORE_ERRORS, Park, Parker
from .store import TakeStatus

__all__ = ["DELAY_ATTR", "ArrivalGate", "ReleasedSlot", "slot_of_kind"]

logger = logging.getLogger(__name__)

#: A released task's booked slot: its due time, its limit, the other limits it holds.
ReleasedSlot = tuple[float, int | None, frozenset[int]]
#: Attribute of the consumer holding its :class:`ArrivalGate`.
DELAY_ATTR = "extras_delay"
_MAX_SLOTS = 100_000


def _seconds_until(eta: Any, now: datetime) -> float | None:
    try:
        when = maybe_iso8601(eta)
    except (TypeError, ValueError, OverflowError):
        return None
    if not isinstance(when, datetime):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - now).total_seconds()


class ArrivalGate:
    """Per-consumer state: verified slots, messages waiting for the store, counts."""

    def __init__(
        self,
        app: Celery,
        parker: Parker,
        *,
        eta_store: bool,
        eta_threshold: float,
        store_retry: float,
        clock: Callable[[], float] = monotonic,
        wall: Callable[[], datetime] = lambda: datetime.fromtimestamp(clock_wall(), UTC),
    ) -> None:
        self.app = app
        self.parker = parker
        self.eta_store = eta_store
        self.eta_threshold = eta_threshold
        self.store_retry = store_retry
        self.clock = clock
        self.wall = wall
        #: task id -> due time (clock) of its booked slot, the index of its limit, and the
        #: other limits whose token it holds
        self.slots: dict[str, ReleasedSlot] = {}
        self.holds = TimerHolds()  # messages held while the store is away
        #: the messages (``id()``, as their holds) of ETA parks in doubt, held until a park
        #: settles them whatever their ETA has become
        self._in_doubt: set[int] = set()
        self.counts = {"taken": 0, "duplicates": 0, "purged": 0, "unverified": 0,
                       "eta_parked": 0}  # fmt: skip
        self._warned_unverified = 0.0

    # -- the limits read this ------------------------------------------------------------------

    def pop_slot(self, task_id: str) -> ReleasedSlot | None:
        """The due time (on :attr:`clock`) of the verified slot of *task_id*, the index of
        the limit it was booked in and the limits whose token it holds besides, once."""
        return self.slots.pop(task_id, None)

    # -- strategies --------------------------------------------------------------------------

    def wrap(self, consumer: Any, name: str, strategy: Callable[..., Any]) -> Callable[..., Any]:
        if getattr(strategy, "_extras_delay_gate", None) is self:
            return strategy
        eta_store = self.eta_store

        def gated(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any,
                  **kwargs: Any) -> Any:  # fmt: skip
            headers = message.headers
            if (
                headers
                and (PARKED_HEADER in headers or (eta_store and headers.get("eta")))
                and self.intercept(consumer, name, message, ack)
            ):
                return None
            return strategy(message, body, ack, reject, callbacks, **kwargs)

        gated._extras_delay_gate = self  # type: ignore[attr-defined]
        gated._extras_wrapped = strategy  # type: ignore[attr-defined]
        return gated

    def intercept(self, consumer: Any, name: str, message: Any, ack: Any) -> bool:
        """``True`` when the gate dealt with *message* (dropped, parked or holding it)."""
        headers = message.headers
        if PARKED_HEADER in headers:
            if not self.parker.health.up():  # the store failed a moment ago: ask it later
                self._wait_for_store(consumer, name, message, ack)
                return True
            try:
                verdict = self.verify(name, headers)
            except STORE_ERRORS as exc:
                self.parker.store_failed(f"checking a released {name}", exc)
                self._wait_for_store(consumer, name, message, ack)
                return True
            self.parker.store_answered()
            if verdict == "drop":
                ack(logger, consumer.connection_errors)
                return True
            if verdict == "run":
                self._passed_eta_dropped(message)
                return False
        if self.eta_store and headers.get("eta"):
            return self._park_eta(consumer, name, message, ack)
        return False

    def verify(self, name: str, headers: Any) -> str:
        """``"run"`` (it took its entry), ``"drop"`` (a duplicate, or purged), ``"ordinary"``
        (unknown)."""
        eid, token, task_id = (
            headers.get(PARKED_HEADER),
            headers.get(CLAIM_HEADER),
            headers.get("id"),
        )
        if not all(isinstance(v, str) and 0 < len(v) <= 200 for v in (eid, token, task_id)):
            self._unverified(name, "malformed")
            return "ordinary"
        taken = self.parker.store.take(eid, task_id, token)
        if taken.status is TakeStatus.DUPLICATE:
            self.counts["duplicates"] += 1
            logger.info("celery-extras: dropping a second copy of released %s[%s]", name, task_id)
            return "drop"
        if taken.status is TakeStatus.PURGED:
            self.counts["purged"] += 1
            logger.info("celery-extras: dropping released %s[%s]: purged from the delay store",
                        name, task_id)  # fmt: skip
            return "drop"
        if taken.status is TakeStatus.UNKNOWN:
            self._unverified(name, "not in the delay store")
            return "ordinary"
        self.counts["taken"] += 1
        slot = slot_of_kind(taken.kind)
        if slot is not None:
            if len(self.slots) >= _MAX_SLOTS:
                self.slots.clear()
            self.slots[task_id] = (self.clock() + taken.due_in, *slot)
        return "run"

    def _passed_eta_dropped(self, message: Any) -> None:
        """A released task whose ETA has passed on celery-extras' clock runs now: its ETA is
        dropped, so Celery's timer does not hold it until the ETA on its own clock (the same
        moment in real time; under simulated time the ETA may be ahead of the real clock)."""
        eta = message.headers.get("eta")
        if eta:
            due_in = _seconds_until(eta, self.wall())
            if due_in is not None and due_in <= 0:
                message.headers["eta"] = None

    def _unverified(self, name: str, why: str) -> None:
        self.counts["unverified"] += 1
        now = self.clock()
        if now - self._warned_unverified >= 60.0:
            self._warned_unverified = now
            logger.warning(
                "celery-extras: a %s message claims to be released from the delay store but "
                "is %s; it runs as an ordinary message, with no booked slot (logged at most "
                "once a minute)",
                name, why,
            )  # fmt: skip

    def _park_eta(self, consumer: Any, name: str, message: Any, ack: Any) -> bool:
        delay = _seconds_until(message.headers.get("eta"), self.wall())
        doubted = id(message) in self._in_doubt
        if not doubted and (delay is None or delay <= self.eta_threshold):
            return False
        eid, entry = self.parker.entry_of_message(message, name, "eta")
        parked = self.parker.park(eid, entry, max(delay or 0.0, 0.0))
        if parked is Park.IN_DOUBT or (doubted and not parked):
            # the store may hold it: never run here (its ETA may have come meanwhile: chaos
            # seed 260130 ran both copies), but parked again until the store answers
            self._in_doubt.add(id(message))
            self._wait_for_store(consumer, name, message, ack)
            return True
        self._in_doubt.discard(id(message))
        if not parked:
            return False  # the store is away: Celery keeps it in the timer, unacked
        self.counts["eta_parked"] += 1
        ack(logger, consumer.connection_errors)
        return True

    def _wait_for_store(self, consumer: Any, name: str, message: Any, ack: Any) -> None:
        """Keep *message* unacked and deliver it to its strategy again after a while."""
        key = id(message)

        def again() -> None:
            if not self.holds.release(consumer, key):
                return
            strategy = consumer.strategies.get(name)
            if strategy is None:
                return
            try:  # as Celery's consumer calls it: no body for protocol 2 (name in headers)
                body = None if "task" in (message.headers or {}) else message.decode()
                strategy(message, body, ack, message.reject_log_error, [])
            except Exception:
                logger.exception("celery-extras: could not deliver held %s again", name)

        self.holds.hold(consumer, key, self.store_retry, again)

    def stop(self) -> None:
        self.holds.drop_all()
        self._in_doubt.clear()

    def info(self) -> dict[str, Any]:
        return {**self.counts, **self.parker.counts, "held_for_store": len(self.holds),
                "store": "down" if self.parker.down else "ok"}  # fmt: skip


#: Most limits a parked entry's kind may name as held (a task's limits are far fewer).
_MOST_HELD = 32


def slot_of_kind(kind: str) -> tuple[int, frozenset[int]] | None:
    """The limit a parked entry of *kind* booked its slot in, and the other limits whose
    token it holds: ``"limit"`` (the first, as every entry a task with one limit parks),
    ``"limit:<index>"``, either followed by ``/<index>,<index>...``; ``None`` for others. A
    malformed list of held limits holds none (they are asked again)."""
    head, _, held_text = kind.partition("/")
    if head == "limit":
        index = 0
    else:
        name, _, number = head.partition(":")
        if name != "limit" or not (number.isdecimal() and len(number) <= 3):
            return None
        index = int(number)
    held = held_text.split(",") if held_text else []
    if len(held) > _MOST_HELD or not all(h.isdecimal() and len(h) <= 3 for h in held):
        held = []
    return index, frozenset(int(h) for h in held) - {index}
