"""Guards against known bugs of the Celery and kombu versions celery-extras supports.

Each guard names the bug it works around, acts as narrowly as it can, and logs
when it acts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.worker.components import Hub, Pool
from celery.worker.consumer.connection import Connection
from kombu.asynchronous import get_event_loop, set_event_loop

from .compat import (
    drop_acks,
    keep_written_jobs,
    loop_closed,
    replace_connection_close,
    restore_interval,
    transport_channels,
)

__all__ = [
    "EventLoopGuard",
    "EventsCloseGuard",
    "PoolFlushGuard",
    "PrefetchRestoreGuard",
    "RedisCloseGuard",
    "RedisRestoreGuard",
]

logger = logging.getLogger(__name__)
#: Celery's setting of the prefetch window's reduction after a reconnect (Celery 5.5+).
PREFETCH_REDUCTION = "worker_enable_prefetch_count_reduction"
#: The longest the close of the old event dispatcher's connection waits for a publish under
#: way on it (Celery's heartbeat retries until the broker answers); then it closes anyway
MUTEX_WAIT = 10.0
#: kombu's virtual transport logs a message delivered after its consumer was cancelled.
_KOMBU_LOGGER = logging.getLogger("kombu.transport.virtual.base")


class RedisCloseGuard(bootsteps.StartStopStep):
    """Keeps a Redis restart from killing the worker.

    When the broker connection is lost, Celery 5.7 closes the old connection and
    ignores only connection errors. kombu 5.7's Redis channel, closed while it
    holds unacked messages to restore, asks the already-dropped connection for
    its ``hostname`` and raises :class:`AttributeError`, which ends the worker
    ("Unrecoverable error"): here plain Celery lost its worker in one Redis
    restart out of four. The first ack or reject of a message delivered on the
    lost connection (a task that finishes after the reconnect, with ``acks_late``)
    reaches the same dropped connection and ends the worker the same way.

    This step makes that close log a warning instead, and turns ack and reject on
    the lost connection's channels into a logged drop: the messages stay in
    Redis's unacked set and are restored after the visibility timeout, as usual
    (the task runs again, as RabbitMQ redelivers a message of a closed channel).
    """

    label = "extras-redis-close-guard"
    requires = (Connection,)

    def start(self, c: Any) -> None:
        connection = c.connection
        if connection is None or connection.transport.driver_type != "redis":
            return
        transport = connection.transport  # collect() drops it before release() runs
        replace_connection_close(connection, lambda close, clean: _guarded(close, transport,
                                                                             clean))  # fmt: skip


class RedisRestoreGuard(bootsteps.StartStopStep):
    """Gives unacked messages back on the green pools' Redis connections too.

    kombu's Redis transport gives back messages left unacked past the visibility timeout
    (a SIGKILLed worker's, a lost connection's) from a timer of the worker's event loop.
    gevent and eventlet run Celery's loop without one, where kombu tries only when a poll
    finds nothing, and the answer to its one-second ``BRPOP`` is always something: an idle
    eventlet worker tried once in 13 s where prefork tried 15 times (2026-11-29), and
    messages a broker restart left unacked waited for the next worker's start (chaos seed
    120364). Here the consumer's timer runs kombu's restore on the transport's interval.
    """

    label = "extras-redis-restore-guard"
    requires = (Connection,)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.entry: Any = None

    def start(self, c: Any) -> None:
        connection = c.connection
        if c.hub is not None or connection is None or connection.transport.driver_type != "redis":
            return  # the event loop's timer does it
        transport = connection.transport
        self.entry = c.timer.call_repeatedly(
            restore_interval(connection), _restore_unacked, (transport,)
        )

    def stop(self, c: Any) -> None:
        if self.entry is not None:
            self.entry.cancel()
            self.entry = None

    shutdown = stop


class PrefetchRestoreGuard(bootsteps.Step):
    """Keeps a reconnect from shrinking the worker's prefetch window for good.

    After a lost connection Celery (5.5 on) lowers the window by the tasks still running,
    then raises it after each ack to ``min(maximum, window + multiplier)``. celery-extras
    widens the window by one for each task a policy holds (so held tasks never take a
    running task's place) and narrows it as they go; the restore caps what it raises at
    the maximum, dropping those widenings, and the narrowings that follow take the window
    below it. A ``threads`` worker of chaos seed 578629 ended a replay with a window of 3 for
    16 after one RabbitMQ restart; a few more and a worker takes one message at a time, or
    none beside what its policies hold. Unless the app sets
    ``worker_enable_prefetch_count_reduction`` itself, this step turns the reduction off:
    after a reconnect the window is whole at once (the running tasks' messages, requeued by
    the broker, count in it when they come again, as before any restart)."""

    label = "extras-prefetch-restore-guard"

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        conf = c.app.conf
        if PREFETCH_REDUCTION in conf.changes or not conf.get(PREFETCH_REDUCTION, False):
            return
        conf[PREFETCH_REDUCTION] = False
        logger.debug("celery-extras: %s = False (the window widened for held tasks "
                     "would be lost as Celery restores it after a reconnect)",
                     PREFETCH_REDUCTION)  # fmt: skip


def _restore_unacked(transport: Any) -> None:
    try:
        transport.cycle.maybe_restore_messages()
    except Exception as exc:  # the broker is away: the next turn tries again
        logger.debug("celery-extras: restoring unacked Redis messages failed: %r", exc)


class EventsCloseGuard(bootsteps.StartStopStep):
    """Keeps a worker without an event loop from freezing as it reconnects to RabbitMQ.

    After a lost connection Celery starts its consumer steps again, and the Events step
    closes the old event dispatcher's connection (an AMQP close, which waits for the
    broker's answer) without the dispatcher's mutex. Celery's heartbeat, sent from a
    timer greenlet or thread under that mutex with ``retry=True``, may meanwhile have
    connected the old connection again and be waiting for its exchange's ``declare-ok``.
    The close takes the answer and drops it ("Received method (40, 11) during closing
    channel 1"); a gevent worker froze there, its consumer never started again (chaos
    seed 172743; plain Celery's heartbeat does the same). Here that close waits for the
    mutex, up to :data:`MUTEX_WAIT` s: the publish under way ends first. RabbitMQ only:
    a Redis channel's close waits for no answer.
    """

    label = "extras-events-close-guard"
    requires = ("celery.worker.consumer.events:Events",)

    def start(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        connection = getattr(dispatcher, "connection", None)
        if c.hub is not None or connection is None or connection.transport.driver_type != "amqp":
            return  # with an event loop its timer runs in the consumer's own thread
        mutex = dispatcher.mutex  # a lost connection's collect waits for no answer
        replace_connection_close(connection, lambda close, clean: (
            _close_under(mutex, close) if clean else close))  # fmt: skip


def _close_under(mutex: Any, close: Callable[[], None]) -> Callable[[], None]:
    """*close*, once *mutex* is free (or :data:`MUTEX_WAIT` s have passed)."""

    def close_when_free() -> None:
        acquired = mutex.acquire(timeout=MUTEX_WAIT)
        if not acquired:
            logger.warning("celery-extras: the old event connection is closed while a "
                           "publish on it has not ended in %.0f s", MUTEX_WAIT)  # fmt: skip
        try:
            close()
        finally:
            if acquired:
                mutex.release()

    return close_when_free


class PoolFlushGuard(bootsteps.StartStopStep):
    """Keeps a warm stop from waiting 30 s, and its last task from running twice.

    From Celery 5.6 on, the prefork pool's ``flush`` (run when the consumer closes: a stop,
    or a lost connection) discards every job whose process has not yet acknowledged
    receiving it, including a job already written whole to the process's pipe in the
    event loop's last turn. The process runs that job anyway, and its result goes
    uncounted: at exit it waits 30 s for the pool to count it, the stop with it (past many
    service managers' grace period, which then SIGKILL the worker), and the message,
    never acked, runs again. Plain Celery does it too, in a race of a millisecond; a
    worker that receives tasks all the time (the delay store's releases) meets it in one
    stop of ten. This step keeps written jobs through the flush: the pool reads their
    acceptance and result as any other's.
    """

    label = "extras-pool-flush-guard"
    requires = (Pool,)

    def start(self, w: Any) -> None:
        keep_written_jobs(w.pool, _kept)


class EventLoopGuard(bootsteps.StartStopStep):
    """Keeps the next worker of this process from running on this one's event loop.

    A worker takes kombu's current event loop if there is one (Celery's ``Hub`` step), and
    kombu before 5.6 leaves a closed loop current: the next worker in the same process (the
    in-process test worker, ``start_worker``, started again) runs on it, with the timer of
    the worker that made it. Its own timer, where the consumer puts every entry (a task
    held by a limit, a coalesced run, the admission tick, Celery's ETA tasks and
    heartbeats), is never fired: a held task never runs, and the loop sleeps 10 s at a
    time (every stop takes that long). kombu 5.6's ``Hub.close`` forgets the loop; this
    step has the hub do the same as it closes (the last step to stop: the pool, stopping
    before it, still fires the loop's timers while it drains). A closed loop an earlier
    worker without this step left current (another app's, plain Celery's) is forgotten as
    the worker builds its steps, before the ``Hub`` step would take it.
    """

    label = "extras-event-loop-guard"
    requires = (Hub,)

    def __init__(self, w: Any, **kwargs: Any) -> None:
        super().__init__(w, **kwargs)
        loop = get_event_loop()  # every step is made before the Hub step makes the hub
        if loop is not None and loop_closed(loop):
            set_event_loop(None)
            logger.info("celery-extras: an event loop another worker of this process "
                        "closed was still current: this worker makes its own")  # fmt: skip

    def include_if(self, w: Any) -> bool:
        return bool(w.use_eventloop)

    def start(self, w: Any) -> None:
        w.hub.on_close.add(_forget_loop)


def _forget_loop(hub: Any) -> None:
    if get_event_loop() is hub:
        set_event_loop(None)


def _kept(count: int) -> None:
    logger.info("celery-extras: the pool keeps %d job(s) already sent to its processes "
                "(their results are waited for)", count)  # fmt: skip


class _Restored(logging.Filter):
    """During a clean close: kombu's "Requeuing undeliverable message ... No consumers" (a
    message that arrived after the consumers were cancelled) is no alarm, the close gives
    it back to its queue with every other unacked message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and "No consumers" in record.getMessage():
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def _guarded(close: Callable[..., None], transport: Any, clean: bool) -> Callable[..., None]:
    """*close* (``collect`` of a lost Redis connection, or ``release`` of one closed cleanly,
    *clean*), made safe for the worker."""

    def guarded(*args: Any, **kwargs: Any) -> None:
        dropped = _restored_at_close if clean else _dropped
        for channel in list(transport_channels(transport)):  # closing one takes it off
            drop_acks(channel, dropped)
        quiet = _Restored()
        if clean:
            _KOMBU_LOGGER.addFilter(quiet)
        try:
            close(*args, **kwargs)
        except AttributeError as exc:
            logger.warning(
                "celery-extras: closing the lost Redis connection failed in kombu (%r); "
                "its unacked messages return after the visibility timeout",
                exc,
            )
        finally:
            _KOMBU_LOGGER.removeFilter(quiet)

    return guarded


def _restored_at_close(delivery_tag: Any, *args: Any, **kwargs: Any) -> None:
    """Ack or reject while a Redis connection closes cleanly: the message stays unacked and
    the close restores it to its queue (kombu's ``restore_unacked_once``)."""
    logger.info("celery-extras: message %s is given back to its queue by the close", delivery_tag)


def _dropped(delivery_tag: Any, *args: Any, **kwargs: Any) -> None:
    """Ack or reject on a channel of a lost Redis connection: leave the message unacked."""
    logger.warning(
        "celery-extras: message %s was delivered on a Redis connection that is gone; it "
        "cannot be acked or rejected any more and returns after the visibility timeout",
        delivery_tag,
    )
