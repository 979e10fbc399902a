"""Consumer bootstep: weighted fair consumption across the worker's queues.

On when ``extras_queue_weights`` is set. After Celery's ``Tasks`` step has made
the task consumer, this step puts a :class:`FairTaskConsumer` in its place and
drains it from the event loop on every tick, so messages reach the pool in
weighted order as fast as the pool frees up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.worker.consumer.tasks import Tasks

from ..compat import pool_poll_start, reserved_requests
from ..settings import settings_of
from .task_consumer import FairTaskConsumer

__all__ = ["FairQueues"]

logger = logging.getLogger(__name__)

#: Seconds between two turns of the hand-off when nothing else wakes the event loop.
NUDGE = 0.01


class FairQueues(bootsteps.StartStopStep):
    """Replaces the task consumer with a weighted fair one when queue weights are set."""

    label = "extras-fair-queues"
    requires = (Tasks,)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        settings = settings_of(c.app)
        self.weights: dict[str, int] | None = settings["queue_weights"]
        self.prefetch: int | None = settings["queue_prefetch"]
        self.enabled = self.weights is not None
        self.fair: FairTaskConsumer | None = None
        self._pool_tick: Callable[[], None] | None = None
        self._nudging: Any = None
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        assert self.weights is not None
        c.task_consumer.cancel()  # Celery's own: it declared the queues and never consumed
        names = set(c.app.amqp.queues.consume_from)
        unknown = sorted(set(self.weights) - names)
        if unknown:
            logger.warning("extras_queue_weights names queues this worker does not consume: %s",
                           ", ".join(unknown))  # fmt: skip
        self._pool_tick = pool_poll_start(c.pool)
        self.fair = c.task_consumer = FairTaskConsumer(
            c, self.weights, self.prefetch or max(1, c.max_prefetch_count), self._room(c)
        )  # not initial_prefetch_count: Celery lowers it after a reconnect, while tasks run
        if c.hub is not None:
            c.hub.on_tick.add(self._tick)
            self._nudging = c.hub.call_repeatedly(NUDGE, self._nudge)
        logger.info("weighted fair queues: %s", self.fair.order.weights)

    def _tick(self) -> None:
        """Hand on what the pool has room for, then let the prefork pool see the new jobs.

        Runs on every turn of the event loop and every :data:`NUDGE` seconds. The loop
        runs its tick callbacks in no set order, and a job handed on after the pool's own
        tick (which starts writing queued jobs to idle processes), or while a message is
        being received, would otherwise wait for the loop's next wake-up: the next
        message, 50 ms later in a trickle. The timer bounds any such wait.
        """
        if self.fair is not None and self.fair.dispatch() and self._pool_tick is not None:
            self._pool_tick()

    def _nudge(self) -> None:
        self._tick()
        if self._pool_tick is not None:
            self._pool_tick()

    def _room(self, c: Any) -> Any:
        if c.hub is None:  # no event loop to drain on: hand messages on as they come
            return lambda: True

        reserved = reserved_requests()

        def room() -> bool:  # a process is free: anything queued in the pool waits FIFO
            limit: int = getattr(c.controller, "max_concurrency", None) or c.pool.num_processes
            return len(reserved) < limit

        return room

    def stop(self, c: Any) -> None:
        if self.fair is not None and c.hub is not None:
            c.hub.on_tick.discard(self._tick)
        if self._nudging is not None:
            self._nudging.cancel()
            self._nudging = None

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        if self.fair is not None:
            self.fair.close()
            self.fair = None

    def info(self, c: Any) -> dict[str, Any]:
        fair = self.fair
        if fair is None:
            return {}
        return {
            "extras_queues": {
                "weights": dict(fair.order.weights),
                "served_first": list(fair.first),
                "prefetch_per_queue": fair.prefetch + fair.extra,
                "buffered": fair.buffered(),
                "dispatched": dict(fair.dispatched),
            }
        }
