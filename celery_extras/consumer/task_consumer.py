"""A task consumer that gives each queue its own window and hands messages on in weighted order.

It stands in for the worker's ``c.task_consumer`` (a single kombu consumer over
every queue): one kombu consumer per queue, each on its own channel with its own
prefetch count, so a flood in one queue can fill only that queue's window.
Delivered messages wait in a small buffer per queue and are passed to the
worker's task handler (``on_message``, set by Celery's event loop: strategies,
ETA, rate limits and revokes work as usual) in weighted order, and only while
``room()`` says the pool can take more, so the pool never queues up a backlog of
one queue ahead of another.

The delay store's due queues (``<queue>.extras-due``) stand outside the weighted
order and are served first: a parked task released for its slot or its ETA must
not wait behind the backlog of its queue.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from kombu.entity import Queue
from kombu.message import Message

from ..delay.entry import DUE_SUFFIX
from .weighted_cycle import WeightedOrder

__all__ = ["BUFFER_ATTR", "FairTaskConsumer"]

#: Attribute of the consumer naming a factory of per-queue buffers (``priority/``'s step)
BUFFER_ATTR = "extras_queue_buffer"


def _fifo(name: str) -> deque[Message]:
    return deque()


class FairTaskConsumer:
    """The worker's task consumer, one channel and buffer per queue, drained in weighted order.

    Implements what Celery calls on ``c.task_consumer``: ``on_message``,
    ``consume``, ``cancel``, ``close``, ``qos``, ``add_queue``,
    ``cancel_by_queue``, ``consuming_from`` and ``queues``.
    """

    def __init__(
        self,
        c: Any,
        weights: Mapping[str, int],
        prefetch: int,
        room: Callable[[], bool],
    ) -> None:
        self.c = c
        self.weights = dict(weights)
        self.prefetch = prefetch  # unacked messages per queue
        self.extra = 0  # ETA/held tasks Celery's QoS asked room for, given to every queue
        self.room = room
        self.on_message: Callable[[Message], Any] | None = None
        self.consumers: dict[str, Any] = {}
        self.retired: dict[str, Any] = {}  # cancelled queues' consumers, channels still open
        self.buffers: dict[str, deque[Message]] = {}
        #: a queue's buffer (a deque; ``c.extras_queue_buffer(name)`` when set: priority's)
        self._new_buffer: Callable[[str], Any] = getattr(c, BUFFER_ATTR, None) or _fifo
        self.dispatched: dict[str, int] = {}
        self.order: WeightedOrder[str] = WeightedOrder({})
        self.first: list[str] = []  # due queues, served before the weighted order
        # kept: c.connection is None by the time a lost connection stops the consumer
        self.errors = (*c.connection.connection_errors, *c.connection.channel_errors)
        for queue in c.app.amqp.queues.consume_from.values():
            self.add_queue(queue)

    # -- what Celery calls -------------------------------------------------------------------

    @property
    def queues(self) -> list[Queue]:
        return [queue for consumer in self.consumers.values() for queue in consumer.queues]

    def consuming_from(self, name: str) -> bool:
        return name in self.consumers

    def add_queue(self, queue: Queue) -> None:
        if queue.name in self.consumers:
            return
        retired = self.retired.pop(queue.name, None)
        if retired is not None:  # consumed again: its channel is still open (see cancel_by_queue)
            self.consumers[queue.name] = retired
            self._set_prefetch(retired)
            self.buffers.setdefault(queue.name, self._new_buffer(queue.name))
            self.dispatched.setdefault(queue.name, 0)
            self._reorder()
            return
        channel = self.c.connection.channel()
        consumer = self.c.app.amqp.TaskConsumer(
            channel,
            queues=[queue],
            on_decode_error=self.c.on_decode_error,
            on_message=partial(self._buffer, queue.name),
        )
        self.consumers[queue.name] = consumer
        self._set_prefetch(consumer)
        self.buffers.setdefault(queue.name, self._new_buffer(queue.name))
        self.dispatched.setdefault(queue.name, 0)
        self._reorder()

    def cancel_by_queue(self, name: str) -> None:
        """Stop consuming *name*; its buffered messages go back to the broker at once.

        The channel stays open until :meth:`close` (or the queue is consumed again):
        kombu 5.5's Redis transport stalls the worker's event loop for good when one
        channel of its connection is closed while the loop runs.
        """
        consumer = self.consumers.pop(name, None)
        if consumer is None:
            return
        self._reorder()
        self._quietly(consumer.cancel)
        for message in self.buffers.pop(name, None) or ():
            self._quietly(message.requeue)
        self.retired[name] = consumer

    def consume(self, no_ack: bool | None = None) -> None:
        for consumer in self.consumers.values():
            consumer.consume(no_ack=no_ack)

    def cancel(self) -> None:
        for consumer in self.consumers.values():
            self._quietly(consumer.cancel)

    def close(self) -> None:
        """Cancel and close every channel; unacked buffered messages return to the broker."""
        self.cancel()
        for consumer in [*self.consumers.values(), *self.retired.values()]:
            self._quietly(consumer.channel.close)
        self.consumers.clear()
        self.retired.clear()
        for buffer in self.buffers.values():
            buffer.clear()

    def qos(self, prefetch_count: int = 0, **kwargs: Any) -> None:
        """Celery's QoS asks for *prefetch_count* in all (it grows while ETA tasks are held):
        each queue keeps its own window and gets the growth on top."""
        initial = self.c.initial_prefetch_count or 0
        self.extra = max(0, prefetch_count - initial) if prefetch_count else 0
        for consumer in self.consumers.values():
            self._set_prefetch(consumer)

    # -- buffering and weighted hand-off -----------------------------------------------------

    def _quietly(self, fun: Callable[[], Any]) -> None:
        """Call *fun*, ignoring the connection's and channel's errors (it may be gone)."""
        with contextlib.suppress(*self.errors):
            fun()

    def _set_prefetch(self, consumer: Any) -> None:
        consumer.qos(prefetch_count=self.prefetch + self.extra, apply_global=False)

    def _buffer(self, name: str, message: Message) -> None:
        buffer = self.buffers.get(name)
        if buffer is None:  # the queue was cancelled while this was on the wire
            self._quietly(message.requeue)
            return
        buffer.append(message)
        self.dispatch()

    def _reorder(self) -> None:
        """Weigh the consumed queues again, due queues apart (they are served first)."""
        self.first = [name for name in self.consumers if name.endswith(DUE_SUFFIX)]
        self.order.update(
            {n: self.weights.get(n, 1) for n in self.consumers if not n.endswith(DUE_SUFFIX)}
        )

    def _ready(self, name: str) -> bool:
        return bool(self.buffers.get(name))

    def _next(self) -> str | None:
        """The queue whose message goes next: a due queue with one, else the weighted pick."""
        for name in self.first:
            if self.buffers.get(name):
                return name
        return self.order.pick(self._ready)

    def dispatch(self) -> int:
        """Hand buffered messages to the worker in weighted order while the pool has room;
        returns how many were handed on."""
        if self.on_message is None:
            return 0
        handed = 0
        while self.room():
            name = self._next()
            if name is None:
                break
            message = self.buffers[name].popleft()
            self.dispatched[name] += 1
            handed += 1
            self.on_message(message)
        return handed

    def buffered(self) -> dict[str, int]:
        return {name: len(buffer) for name, buffer in self.buffers.items()}
