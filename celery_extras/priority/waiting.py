"""The worker's requests waiting for a pool process, taken in priority order.

Celery hands a request to the prefork pool through the worker's semaphore
(``LaxBoundedSemaphore``, one count per pool process): a request that finds every process
busy waits in the semaphore's list, and the first to wait goes when a process frees.
:class:`PriorityWaiters` stands in for that list: the request that goes is the best waiting
then (:class:`~.buffer.PriorityBuffer`), so the choice is made when a process frees, not
when the message was fetched. Acks, revokes, time limits, ETA and rate limits are Celery's
own: only the order of the list changes. A request waiting here does not count against the
prefetch window (up to *extra* of them), so a better message sent behind a backlog is
fetched while the pool is busy, not after the next task starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from .. import compat
from .buffer import PriorityBuffer, amqp_level, redis_level

__all__ = ["PriorityWaiters", "level_function"]

logger = logging.getLogger(__name__)

#: ``level_of(request) -> (level, queue)``
LevelOf = Callable[[Any], tuple[int, str]]


def level_function(driver: str, max_priorities: Mapping[str, int]) -> LevelOf | None:
    """How a request's level is read on a broker of kind *driver*: Redis's order (0 first),
    RabbitMQ's on the queues (by routing key) with an ``x-max-priority`` in
    *max_priorities* (other queues: one level, arrival order); ``None`` for other brokers."""
    if driver == "redis":

        def on_redis(request: Any) -> tuple[int, str]:
            info = _delivery_info(request)
            return redis_level(info.get("priority")), str(info.get("routing_key") or "")

        return on_redis
    if driver == "amqp":

        def on_rabbitmq(request: Any) -> tuple[int, str]:
            info = _delivery_info(request)
            queue = str(info.get("routing_key") or "")
            top = max_priorities.get(queue)
            return (0 if top is None else amqp_level(info.get("priority"), top)), queue

        return on_rabbitmq
    return None


def _delivery_info(request: Any) -> Mapping[str, Any]:
    info = getattr(request, "delivery_info", None)
    return info if isinstance(info, Mapping) else {}


class PriorityWaiters:
    """A semaphore's waiting list (``append``, ``popleft``, ``clear``), best first.

    *consumer* gives the worker's consumer (its prefetch window is widened by one for each
    request waiting here, at most *extra* at once; ``None``: no bound)."""

    def __init__(self, buffer: PriorityBuffer[Any], level_of: LevelOf,
                 consumer: Callable[[], Any], extra: int | None) -> None:  # fmt: skip
        self.buffer = buffer
        self.level_of = level_of
        self.consumer = consumer
        self.extra = extra
        self._widened = 0  # always min(waiting, extra): the window is that much wider
        self.served = 0

    def append(self, waiter: tuple[Any, ...]) -> None:
        """*waiter*: ``(callback, args, kwargs)`` as the semaphore keeps it; ``args[0]`` is
        the request. Never raises: a request it cannot read waits at the first level."""
        args = waiter[1] if len(waiter) > 1 and isinstance(waiter[1], tuple) else ()
        try:
            level, queue = self.level_of(args[0]) if args else (0, "")
        except Exception:  # a request shaped otherwise: it waits, at the first level
            logger.exception("celery-extras: priority of %r unread", args[:1])
            level, queue = 0, ""
        self.buffer.push(waiter, level, queue)
        if self.extra is None or self._widened < self.extra:
            consumer = self.consumer()
            if consumer is not None and getattr(consumer, "qos", None) is not None:
                compat.widen_prefetch(consumer)
                self._widened += 1

    def popleft(self) -> Any:
        entry = self.buffer.pop()  # IndexError when none waits: the semaphore counts it up
        self.served += 1
        if self._widened > len(self.buffer):
            self._widened -= 1
            consumer = self.consumer()
            if consumer is not None and getattr(consumer, "qos", None) is not None:
                compat.narrow_prefetch(consumer)
        return entry.item

    def clear(self) -> None:
        """The connection is lost (Celery's ``on_close``): its requests are dropped, the
        broker delivers them again; the new connection's window starts anew."""
        self.buffer.clear()
        self._widened = 0

    def __len__(self) -> int:
        return len(self.buffer)

    def info(self) -> dict[str, Any]:
        """What ``inspect stats`` shows: waiting requests per queue per level."""
        counts = self.buffer.counts()
        return {
            "waiting": {q: {str(k): v for k, v in levels.items()} for q, levels in counts.items()},
            "oldest_wait": round(self.buffer.oldest_wait(), 3),
            "served": self.served,
            "widened": self._widened,
        }
