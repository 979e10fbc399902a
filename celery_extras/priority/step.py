"""Worker bootstep: with ``extras_priority`` on, requests wait for a pool process in
priority order, and the Redis transport has ten levels.

The request that goes to a free pool slot is the best waiting then, whenever it was
fetched, on every pool that runs tasks beside the consumer:

* prefork: after Celery's ``Pool`` step made the worker's semaphore, its waiting list
  becomes a :class:`~.waiting.PriorityWaiters`;
* threads, gevent, eventlet (no such semaphore): :func:`~.dispatch.hold_requests` puts a
  :class:`~.dispatch.HeldDispatch` in the worker's ``process_task``, which holds what the
  pool has no room for in the same list until a task ends.

solo runs each task inline in the consumer, as it is delivered (nothing ever waits for a
slot), and prefork with ``worker_pool_putlocks = False`` hands every request straight to
the pool: their requests run in the broker's order, which on Redis is the ten distinct
levels; the step says so once at start, and ``inspect stats`` shows ``at_dispatch``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from .. import compat
from ..settings import settings_of
from .buffer import PriorityBuffer
from .dispatch import HeldDispatch, hold_requests
from .transport import distinct_levels
from .waiting import PriorityWaiters, level_function

__all__ = ["PriorityStep", "max_priorities"]

logger = logging.getLogger(__name__)


def max_priorities(app: Any) -> dict[str, int]:
    """``{routing key: x-max-priority}`` of the app's queues that have one (Celery's
    ``task_queue_max_priority`` gives it to every queue it declares)."""
    found: dict[str, int] = {}
    for name, queue in (app.amqp.queues or {}).items():
        top = getattr(queue, "max_priority", None)
        if top is None:
            top = (getattr(queue, "queue_arguments", None) or {}).get("x-max-priority")
        if isinstance(top, int) and top > 0:
            found[name] = top
            if getattr(queue, "routing_key", None):
                found.setdefault(str(queue.routing_key), top)
    default = app.conf.task_queue_max_priority
    if isinstance(default, int) and default > 0:
        found.setdefault(app.conf.task_default_routing_key or app.conf.task_default_queue,
                         default)  # fmt: skip
    return found


class PriorityStep(bootsteps.StartStopStep):
    """Orders the requests waiting for a pool process by priority (``extras_priority``)."""

    label = "extras-priority"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        settings = settings_of(parent.app)
        self.enabled: bool = settings["priority"]
        self.aging: float | None = settings["priority_aging"]
        self.extra: int | None = settings["priority_prefetch"]
        self.waiters: PriorityWaiters | None = None
        self.dispatch: HeldDispatch | None = None
        self.broker = ""
        if self.enabled:
            distinct_levels(parent.app)  # before the consumer connects

    def create(self, parent: Any) -> None:
        if not self.enabled:
            return
        app = parent.app
        with app.connection_for_write() as connection:  # not connected: its transport's kind
            self.broker = connection.transport.driver_type
        level_of = level_function(self.broker, max_priorities(app))
        consumer = lambda: getattr(parent, "consumer", None)  # noqa: E731 (made after this)
        waiters = None if level_of is None else PriorityWaiters(
            PriorityBuffer(self.aging), level_of, consumer, self.extra)  # fmt: skip
        if waiters is not None and _semaphore_fed(parent):
            if compat.order_semaphore_waiting(parent.semaphore, waiters):
                self.waiters = waiters
        elif waiters is not None:
            self.dispatch = hold_requests(parent, waiters, consumer)
            self.waiters = waiters if self.dispatch is not None else None
        if self.waiters is None:
            logger.info(
                "celery-extras: priority: tasks reach this pool (%s) in the broker's order",
                getattr(parent.pool_cls, "__name__", parent.pool_cls),
            )  # fmt: skip

    def info(self, parent: Any) -> dict[str, Any]:
        if not self.enabled:
            return {}
        shown: dict[str, Any] = {"broker": self.broker, "aging": self.aging,
                                 "at_dispatch": self.waiters is not None}  # fmt: skip
        if self.dispatch is not None:
            shown.update(self.dispatch.info())
        elif self.waiters is not None:
            shown.update(self.waiters.info())
        return {"extras_priority": shown}


def _semaphore_fed(parent: Any) -> bool:
    """Whether Celery hands requests to the pool through the worker's semaphore (prefork)."""
    return getattr(parent, "semaphore", None) is not None and parent.process_task == getattr(
        parent, "_process_task_sem", None
    )
