"""The worker's side of the delay store: the arrival gate and the mover thread.

* :class:`ArrivalGate` sees every task message before its strategy. A message
  a mover published (header ``extras_parked``) takes its entry in the store
  first: a duplicate is acked and dropped, a message whose entry, task or claim
  token the store does not know is an ordinary message (no booked slot: a
  forged header buys nothing), and a limited task that took its entry keeps
  its booked slot for the limits (:meth:`ArrivalGate.pop_slot`). With
  ``extras_eta_store``, a message whose ETA is further away than
  ``extras_eta_threshold`` is parked and only then acked. While the store
  cannot answer, such messages wait in the worker's timer, unacked.
* :class:`MoverThread` runs one :class:`~.core.Mover` per worker (no leader):
  it publishes each due entry to the due queue of the queue it came from, a
  lead time before it is due. Every worker consumes the due queue of each of
  its queues beside the queue itself, so a released task never waits behind
  its queue's backlog.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery.utils.time import maybe_iso8601

from ..admission.waits import TimerHolds
from ..signals import task_released
from .core import Claim, Mover, Take
from .entry import CLAIM_HEADER, PARKED_HEADER, Entry
from .parking import STORE_ERRORS, Parker, due_queue

__all__ = ["DELAY_ATTR", "ArrivalGate", "MoverThread", "publish_entry"]

logger = logging.getLogger(__name__)

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
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.app = app
        self.parker = parker
        self.eta_store = eta_store
        self.eta_threshold = eta_threshold
        self.store_retry = store_retry
        self.clock = clock
        self.wall = wall
        self.slots: dict[str, float] = {}  # task id -> due time of its booked slot (clock)
        self.holds = TimerHolds()  # messages held while the store is away
        self.counts = {"taken": 0, "duplicates": 0, "unverified": 0, "eta_parked": 0}
        self._warned_unverified = 0.0

    # -- the limits read this ------------------------------------------------------------------

    def pop_slot(self, task_id: str) -> float | None:
        """The due time (on :attr:`clock`) of the verified slot of *task_id*, once."""
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
                return False
        if self.eta_store and headers.get("eta"):
            return self._park_eta(consumer, name, message, ack)
        return False

    def verify(self, name: str, headers: Any) -> str:
        """``"run"`` (it took its entry), ``"drop"`` (a duplicate), ``"ordinary"`` (unknown)."""
        eid, token, task_id = (
            headers.get(PARKED_HEADER),
            headers.get(CLAIM_HEADER),
            headers.get("id"),
        )
        if not all(isinstance(v, str) and 0 < len(v) <= 200 for v in (eid, token, task_id)):
            self._unverified(name, "malformed")
            return "ordinary"
        taken = self.parker.store.take(eid, task_id, token)
        if taken.status is Take.DUPLICATE:
            self.counts["duplicates"] += 1
            logger.info("celery-extras: dropping a second copy of released %s[%s]", name, task_id)
            return "drop"
        if taken.status is Take.UNKNOWN:
            self._unverified(name, "not in the delay store")
            return "ordinary"
        self.counts["taken"] += 1
        if taken.kind == "limit":
            if len(self.slots) >= _MAX_SLOTS:
                self.slots.clear()
            self.slots[task_id] = self.clock() + taken.due_in
        return "run"

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
        if delay is None or delay <= self.eta_threshold:
            return False
        eid, entry = self.parker.entry_of_message(message, name, "eta")
        if not self.parker.park(eid, entry, delay):
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

    def info(self) -> dict[str, Any]:
        return {**self.counts, **self.parker.counts, "held_for_store": len(self.holds),
                "store": "down" if self.parker.down else "ok"}  # fmt: skip


def publish_entry(app: Celery, entry: Entry, claim: Claim) -> None:
    """Publish a claimed entry to the due queue of its queue (or its own route)."""
    headers = {**entry.headers, PARKED_HEADER: claim.entry_id, CLAIM_HEADER: claim.token}
    if entry.queue:
        queue = due_queue(entry.queue)
        exchange, routing_key, declare = queue.exchange.name, queue.routing_key, [queue]
    else:
        exchange, routing_key, declare = entry.exchange, entry.routing_key, []
    with app.producer_or_acquire() as producer:
        producer.publish(
            entry.body,
            exchange=exchange,
            routing_key=routing_key,
            headers=headers,
            content_type=entry.content_type,
            content_encoding=entry.content_encoding,
            declare=declare,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            **entry.properties,
        )


class MoverThread:
    """Runs a :class:`~.core.Mover` in a daemon thread until :meth:`stop`."""

    def __init__(self, app: Celery, parker: Parker, settings: Mapping[str, Any]) -> None:
        self.app = app
        self.parker = parker
        self.store_retry = float(settings.get("limit_store_retry", 1.0))
        self.settings = settings
        self.mover: Mover | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error = ""

    def _make_mover(self) -> Mover:
        settings, app = self.settings, self.app
        return Mover(
            self.parker.store,
            lambda entry, claim: publish_entry(app, entry, claim),
            lead=settings["delay_lead"],
            lease=settings["delay_lease"],
            recheck=settings["delay_recheck"],
            batch=settings["delay_batch"],
            poll=settings["delay_poll"],
            on_released=self._released,
        )

    def _released(self, entry: Entry, claim: Claim) -> None:
        task_released.send(sender=entry.task, task_id=entry.task_id)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="extras-delay-mover", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.mover is None:
                    self.mover = self._make_mover()
                sleep = self.mover.run_once()
                self.parker.store_answered()
            except STORE_ERRORS as exc:
                self.last_error = repr(exc)[:200]
                self.parker.store_failed("moving due entries", exc)
                sleep = self.store_retry
            except Exception as exc:  # the mover must outlive any bug or bad entry
                self.last_error = repr(exc)[:200]
                logger.exception("celery-extras: the delay mover failed; it goes on")
                sleep = self.store_retry
            self._stop.wait(sleep)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mover": self.mover.info() if self.mover else {}}
        if self.last_error:
            out["mover_error"] = self.last_error
        return out
