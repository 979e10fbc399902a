"""Fair queues and priority together: each queue's buffer taken in priority order.

With ``extras_queue_weights`` the worker's messages wait in one buffer per queue until the
pool has room (``consumer/task_consumer.py``); the weights choose the queue, and with
``extras_priority`` this buffer (a :class:`QueueBuffer`) chooses the message within it:
the best level first, FIFO within a level, with aging.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from celery import bootsteps
from celery.worker.consumer.tasks import Tasks

from ..consumer.task_consumer import BUFFER_ATTR
from ..settings import settings_of
from .buffer import PriorityBuffer, amqp_level, redis_level
from .step import max_priorities

__all__ = ["PriorityQueueBuffers", "QueueBuffer"]


class QueueBuffer:
    """One queue's delivered messages (``append``, ``popleft``, ``clear``, iteration), best
    first; *level_of* reads a message's level."""

    def __init__(self, buffer: PriorityBuffer[Any], level_of: Callable[[Any], int]) -> None:
        self.buffer = buffer
        self.level_of = level_of

    def append(self, message: Any) -> None:
        self.buffer.push(message, self.level_of(message))

    def popleft(self) -> Any:
        return self.buffer.pop().item

    def clear(self) -> None:
        self.buffer.clear()

    def __len__(self) -> int:
        return len(self.buffer)

    def __bool__(self) -> bool:
        return bool(len(self.buffer))

    def __iter__(self) -> Iterator[Any]:
        return iter([entry.item for entry in sorted(self.buffer, key=_rank)])


def _rank(entry: Any) -> tuple[float, int]:
    return entry.key, entry.seq


def _priority(message: Any) -> object:
    return (getattr(message, "properties", None) or {}).get("priority")


class PriorityQueueBuffers(bootsteps.Step):
    """Consumer step: with ``extras_priority``, fair queues' buffers are priority-ordered."""

    label = "extras-priority-queues"
    requires = (Tasks,)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        settings = settings_of(c.app)
        if not settings["priority"]:
            return
        aging: float | None = settings["priority_aging"]
        with c.app.connection_for_write() as connection:  # not connected: its kind
            driver = connection.transport.driver_type
        tops = max_priorities(c.app)

        def new_buffer(name: str) -> QueueBuffer:
            top = tops.get(name)
            if driver == "amqp":
                if top is None:
                    return QueueBuffer(PriorityBuffer(aging), lambda m: 0)
                return QueueBuffer(PriorityBuffer(aging), lambda m: amqp_level(_priority(m), top))
            return QueueBuffer(PriorityBuffer(aging), lambda m: redis_level(_priority(m)))

        setattr(c, BUFFER_ATTR, new_buffer)
