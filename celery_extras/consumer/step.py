"""Consumer bootstep: weighted fair consumption across the worker's queues.

On when ``extras_queue_weights`` is set. After Celery's ``Tasks`` step has made
the task consumer, this step puts a :class:`FairTaskConsumer` in its place and
drains it from the event loop on every tick, so messages reach the pool in
weighted order as fast as the pool frees up.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker import state
from celery.worker.consumer.tasks import Tasks

from .task_consumer import FairTaskConsumer

__all__ = ["FairQueues"]

logger = logging.getLogger(__name__)


class FairQueues(bootsteps.StartStopStep):
    """Replaces the task consumer with a weighted fair one when queue weights are set."""

    label = "extras-fair-queues"
    requires = (Tasks,)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        from ..install import settings_of  # install imports this module

        settings = settings_of(c.app)
        self.weights: dict[str, int] | None = settings["queue_weights"]
        self.prefetch: int | None = settings["queue_prefetch"]
        self.enabled = self.weights is not None
        self.fair: FairTaskConsumer | None = None
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        assert self.weights is not None
        c.task_consumer.cancel()  # Celery's own: it declared the queues and never consumed
        names = set(c.app.amqp.queues.consume_from)
        unknown = sorted(set(self.weights) - names)
        if unknown:
            logger.warning("extras_queue_weights names queues this worker does not consume: %s",
                           ", ".join(unknown))  # fmt: skip
        self.fair = c.task_consumer = FairTaskConsumer(
            c, self.weights, self.prefetch or max(1, c.initial_prefetch_count), self._room(c)
        )
        if c.hub is not None:
            c.hub.on_tick.add(self.fair.dispatch)
        logger.info("weighted fair queues: %s", self.fair.order.weights)

    def _room(self, c: Any) -> Any:
        if c.hub is None:  # no event loop to drain on: hand messages on as they come
            return lambda: True

        def room() -> bool:  # a process is free: anything queued in the pool waits FIFO
            limit: int = getattr(c.controller, "max_concurrency", None) or c.pool.num_processes
            return len(state.reserved_requests) < limit

        return room

    def stop(self, c: Any) -> None:
        if self.fair is not None and c.hub is not None:
            c.hub.on_tick.discard(self.fair.dispatch)

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
                "prefetch_per_queue": fair.prefetch + fair.extra,
                "buffered": fair.buffered(),
                "dispatched": dict(fair.dispatched),
            }
        }
