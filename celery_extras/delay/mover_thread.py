"""The worker's mover thread: it runs one :class:`~.mover.Mover` per worker (no leader).

:class:`MoverThread` publishes each due entry (:func:`publish_entry`) to the due
queue of the queue it came from, a lead time before it is due. Every worker
consumes the due queue of each of its queues beside the queue itself, so a
released task never waits behind its queue's backlog. While the store cannot
answer, the thread waits ``extras_store_retry`` seconds and tries again. It publishes
on a broker connection of its own with publisher confirms (:class:`ConfirmedPublisher`).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery
from kombu.connection import Connection
from kombu.messaging import Producer

from ..clock import monotonic
from ..signals import task_released
from ..threads import FORK_GATE, start_thread
from .entry import CLAIM_HEADER, PARKED_HEADER, Entry
from .mover import Mover
from .parking import STORE_ERRORS, Parker, due_queue
from .store import Claim

__all__ = ["ConfirmedPublisher", "MoverThread", "Unconfirmed", "app_mover", "lookahead",
           "publish_entry"]  # fmt: skip

#: Named after the module the thread came from, so logging set-ups keep working.
logger = logging.getLogger("celery_extras.delay.gate")


#: Due queues by name, built once (a herd is thousands of publishes to one).
_due_queue = functools.lru_cache(maxsize=1024)(due_queue)


#: Seconds the mover waits for the broker to confirm a batch's publishes (AMQP) before it
#: gives up on them: their entries stay claimed and are claimed again when their lease ends.
CONFIRM_TIMEOUT = 2.0


def publish_entry(
    app: Celery, entry: Entry, claim: Claim, producer: Producer | None = None,
    retry: bool = True,
) -> None:  # fmt: skip
    """Publish a claimed entry to the due queue of its queue (or its own route), with
    *producer* or one of the app's pool (*retry*: kombu's, on a connection error). A due
    queue is reached through the default exchange, by name: on Redis that is one ``LPUSH``,
    where its own exchange costs a read of the exchange's bindings first."""
    headers = {**entry.headers, PARKED_HEADER: claim.entry_id, CLAIM_HEADER: claim.token}
    if entry.queue:
        queue = _due_queue(entry.queue)
        exchange, routing_key, declare = "", queue.name, [queue]
    else:
        exchange, routing_key, declare = entry.exchange, entry.routing_key, []
    with app.producer_or_acquire(producer) as chosen:
        chosen.publish(
            entry.body,
            exchange=exchange,
            routing_key=routing_key,
            headers=headers,
            content_type=entry.content_type,
            content_encoding=entry.content_encoding,
            declare=declare,
            retry=retry,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            **entry.properties,
        )


class Unconfirmed(Exception):
    """The broker refused a publish, or did not confirm it in time."""


class ConfirmedPublisher:
    """Publishes claimed entries on a broker connection of its own and, on AMQP, confirms
    them: :meth:`confirm` returns once the broker confirmed every publish of the batch, so
    the mover releases only what the broker has. Without confirms a message written as
    RabbitMQ stops returns as if sent and is lost, and its released entry waits
    ``extras_delay_recheck`` to be published again. A batch is confirmed at once (the
    channel in confirm mode, the acks read at the end), not one round trip per message. A
    Redis publish is confirmed by its reply: there :meth:`confirm` waits for nothing."""

    def __init__(self, app: Celery, timeout: float = CONFIRM_TIMEOUT) -> None:
        self.app = app
        self.timeout = timeout
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        self._confirms = False  # the channel is in confirm mode (AMQP)
        self._sent = 0  # the last publish's delivery tag on the channel
        self._unconfirmed: set[int] = set()
        self._refused = False
        self._lost = False  # the connection was lost with publishes unconfirmed

    def __call__(self, entry: Entry, claim: Claim) -> None:
        """Publish; a failed publish drops the connection, and the next opens a new one: on
        Redis, kombu leaves a connection whose retries ran out during an outage unusable
        for good (chaos seed 120364); on AMQP the delivery tags start again on the next, and
        the first of a batch is tried once more on a new one (the broker closes a connection
        idle past its heartbeat)."""
        for last in (False, True):
            producer = self._producer or self._open()
            try:
                publish_entry(self.app, entry, claim, producer, retry=not self._confirms)
            except Exception:
                first = not self._unconfirmed
                self.close()
                if not self._confirms:
                    raise
                if not first:  # the batch's earlier publishes go unconfirmed
                    self._lost = True
                if last or not first:
                    raise
                continue
            if self._confirms:
                self._sent += 1
                self._unconfirmed.add(self._sent)
            return

    def confirm(self) -> None:
        """Return once the broker confirmed every publish so far; raise :class:`Unconfirmed`
        (the connection dropped) when it refused one or did not confirm within the timeout."""
        if self._lost:
            self._lost = False
            raise Unconfirmed("the connection was lost before the broker confirmed the batch")
        if self._connection is None or not self._confirms:
            return
        deadline = monotonic() + self.timeout
        try:
            while self._unconfirmed and not self._refused:
                left = deadline - monotonic()
                if left <= 0:
                    raise Unconfirmed(f"{len(self._unconfirmed)} publishes not confirmed "
                                      f"within {self.timeout:g} s")  # fmt: skip
                self._connection.drain_events(timeout=left)
            if self._refused:
                raise Unconfirmed("the broker refused a publish (basic.nack)")
        except Exception:
            self.close()
            raise

    def _open(self) -> Producer:
        connection = self.app.connection_for_write()
        try:
            channel = connection.default_channel
            self._confirms = connection.transport.driver_type == "amqp" and hasattr(
                channel, "confirm_select"
            )
            self._sent, self._unconfirmed, self._refused = 0, set(), False
            if self._confirms:
                channel.confirm_select()
                channel.events["basic_ack"].add(self._acked)
                channel.events["basic_nack"].add(self._nacked)
        except Exception:
            connection.collect()
            raise
        self._connection, self._producer = connection, Producer(channel)
        return self._producer

    def _acked(self, tag: int, multiple: bool) -> None:
        if multiple:
            self._unconfirmed = {one for one in self._unconfirmed if one > tag}
        else:
            self._unconfirmed.discard(tag)

    def _nacked(self, tag: int, multiple: bool) -> None:
        self._refused = True

    def close(self) -> None:
        if self._connection is not None:
            self._connection.collect()  # closes what it can, raises nothing
            self._connection = self._producer = None


def lookahead(app: Celery, configured: float) -> float:
    """*configured* (``extras_delay_lookahead``), at most half the Redis broker's visibility
    timeout: a message published ahead waits unacked in a worker's timer, and one held past
    the visibility timeout is delivered again."""
    visibility = (app.conf.broker_transport_options or {}).get("visibility_timeout", 3600)
    try:
        return min(configured, float(visibility) / 2)
    except (TypeError, ValueError):
        return configured


def app_mover(
    app: Celery,
    parker: Parker,
    settings: Mapping[str, Any],
    *,
    on_released: Callable[[Entry, Claim], None],
    lead: float | None = None,
    publisher: ConfirmedPublisher | None = None,
) -> Mover:
    """A :class:`~.mover.Mover` of *app*'s delay store with its settings, publishing with
    *publisher* (by default :func:`publish_entry` on the app's producer pool, unconfirmed;
    *lead*: another lead than ``extras_delay_lead``)."""
    return Mover(
        parker.store,
        publisher or (lambda entry, claim: publish_entry(app, entry, claim)),
        lead=settings["delay_lead"] if lead is None else lead,
        lookahead=lookahead(app, settings["delay_lookahead"]),
        pace=settings["delay_herd_rate"],
        lease=settings["delay_lease"],
        recheck=settings["delay_recheck"],
        batch=settings["delay_batch"],
        poll=settings["delay_poll"],
        on_released=on_released,
        confirm=publisher.confirm if publisher is not None else None,
    )


class MoverThread:
    """Runs a :class:`~.mover.Mover` in a daemon thread until :meth:`stop`."""

    def __init__(self, app: Celery, parker: Parker, settings: Mapping[str, Any]) -> None:
        self.app = app
        self.parker = parker
        self.store_retry = float(settings["store_retry"])
        self.settings = settings
        self.mover: Mover | None = None
        self.publisher = ConfirmedPublisher(app)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error = ""

    def _make_mover(self) -> Mover:
        return app_mover(self.app, self.parker, self.settings, on_released=self._released,
                         publisher=self.publisher)  # fmt: skip

    def _released(self, entry: Entry, claim: Claim) -> None:
        task_released.send(sender=entry.task, task_id=entry.task_id)

    def start(self) -> None:
        self._stop.clear()
        self._thread = start_thread(self._run, "extras-delay-mover")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with FORK_GATE.operation():
                    sleep = self._round()
                self._stop.wait(sleep)
        finally:
            self.publisher.close()

    def _round(self) -> float:
        """One round of the mover: the seconds until the next."""
        if not self.parker.health.up():  # the store failed a moment ago, for this process
            return self.store_retry
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
        return sleep

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
