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
from kombu.messaging import Producer

from ..signals import task_released
from ..threads import FORK_GATE, start_thread
from .entry import CLAIM_HEADER, PARKED_HEADER, Entry
from .mover import Mover
from .parking import STORE_ERRORS, Parker, due_queue
from .store import Claim

__all__ = ["ConfirmedPublisher", "MoverThread", "app_mover", "lookahead", "publish_entry"]

#: Named after the module the thread came from, so logging set-ups keep working.
logger = logging.getLogger("celery_extras.delay.gate")


#: Due queues by name, built once (a herd is thousands of publishes to one).
_due_queue = functools.lru_cache(maxsize=1024)(due_queue)


#: Seconds the mover waits for the broker to confirm a publish (AMQP) before it gives up
#: on it: the entry stays claimed and is claimed again when its lease ends.
CONFIRM_TIMEOUT = 2.0


def publish_entry(
    app: Celery, entry: Entry, claim: Claim, producer: Producer | None = None
) -> None:
    """Publish a claimed entry to the due queue of its queue (or its own route), with
    *producer* or one of the app's pool. A due queue is reached through the default
    exchange, by name: on Redis that is one ``LPUSH``, where its own exchange costs a read
    of the exchange's bindings first."""
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
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            **({"confirm_timeout": CONFIRM_TIMEOUT} if producer is not None else {}),
            **entry.properties,
        )


class ConfirmedPublisher:
    """Publishes claimed entries on a broker connection of its own, with publisher confirms
    on AMQP: a publish returns once the broker has the message, so the mover releases only
    what the broker has. Without them a message written as RabbitMQ stops is lost unseen,
    and its entry waits ``extras_delay_recheck`` to be published again. (A Redis publish is
    confirmed by its reply; the transport ignores the option.)"""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._producer: Producer | None = None

    def __call__(self, entry: Entry, claim: Claim) -> None:
        if self._producer is None:
            connection = self.app.connection_for_write(transport_options={"confirm_publish": True})
            self._producer = Producer(connection)
        publish_entry(self.app, entry, claim, self._producer)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.connection.collect()  # closes what it can, raises nothing
            self._producer = None


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
    publish: Callable[[Entry, Claim], None] | None = None,
) -> Mover:
    """A :class:`~.mover.Mover` of *app*'s delay store with its settings, publishing with
    *publish* (by default :func:`publish_entry` on the app's producer pool; *lead*: another
    lead than ``extras_delay_lead``)."""
    return Mover(
        parker.store,
        publish or (lambda entry, claim: publish_entry(app, entry, claim)),
        lead=settings["delay_lead"] if lead is None else lead,
        lookahead=lookahead(app, settings["delay_lookahead"]),
        pace=settings["delay_herd_rate"],
        lease=settings["delay_lease"],
        recheck=settings["delay_recheck"],
        batch=settings["delay_batch"],
        poll=settings["delay_poll"],
        on_released=on_released,
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
                         publish=self.publisher)  # fmt: skip

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
