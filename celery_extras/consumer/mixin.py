"""``FairConsumerMixin``: weighted fair consumption for plain kombu consumers.

For users of :class:`kombu.mixins.ConsumerMixin`: declare queues with weights
and a handler. Each queue is consumed on its own channel with a window of unacked
messages proportional to its weight (at most ``prefetch``), and what has been
delivered is handed to the handler in smooth weighted order, so when every queue
has a backlog the handler's time is shared by weight. Connection losses restart
the loop at most ``restart_rate`` times a second (a token bucket, ``restart_burst``
at once).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from functools import cached_property, partial
from typing import Any

from kombu.entity import Queue
from kombu.messaging import Consumer
from kombu.mixins import ConsumerMixin
from kombu.utils.limits import TokenBucket

from .weighted_cycle import WeightedOrder

__all__ = ["FairConsumerMixin"]


class FairConsumerMixin(ConsumerMixin):
    """Subclass, set ``connection``, and implement :meth:`get_weighted_queues` and
    :meth:`on_fair_message` (which must ack or reject each message)."""

    #: Unacked messages of the heaviest queue; a queue of half its weight gets half.
    prefetch: int = 20
    restart_rate: float = 1.0
    restart_burst: int = 3
    #: How long one iteration waits for more deliveries before handing on what it has
    #: (Redis answers a BRPOP asynchronously: a zero wait would never see it).
    fill_wait: float = 0.005

    def get_weighted_queues(self) -> Mapping[Queue, int]:
        raise NotImplementedError("FairConsumerMixin subclasses return {Queue: weight}")

    def on_fair_message(self, body: Any, message: Any) -> None:
        raise NotImplementedError("FairConsumerMixin subclasses handle (body, message)")

    @cached_property
    def restart_limit(self) -> TokenBucket:
        return TokenBucket(self.restart_rate, capacity=self.restart_burst)

    def window(self, weight: int, heaviest: int) -> int:
        """Unacked messages allowed for a queue of *weight*."""
        return max(1, math.ceil(self.prefetch * weight / heaviest))

    def get_consumers(self, _: Any, channel: Any) -> list[Consumer]:
        weighted = dict(self.get_weighted_queues())
        heaviest = max(weighted.values())
        self._order: WeightedOrder[str] = WeightedOrder({q.name: w for q, w in weighted.items()})
        self._buffers: dict[str, deque[tuple[Any, Any]]] = {q.name: deque() for q in weighted}
        self._connection = channel.connection.client
        consumers = []
        for queue, weight in weighted.items():
            consumers.append(
                Consumer(
                    self._connection.channel(),
                    queues=[queue],
                    callbacks=[partial(self._buffer, queue.name)],
                    on_decode_error=self.on_decode_error,
                    prefetch_count=self.window(weight, heaviest),
                )
            )
        return consumers

    def on_consume_end(self, connection: Any, channel: Any) -> None:
        for buffer in self._buffers.values():
            buffer.clear()  # unacked: the broker redelivers them

    def buffered(self) -> dict[str, int]:
        return {name: len(buffer) for name, buffer in self._buffers.items()}

    def _buffer(self, name: str, body: Any, message: Any) -> None:
        self._buffers[name].append((body, message))

    def _ready(self, name: str) -> bool:
        return bool(self._buffers[name])

    def on_iteration(self) -> None:
        """Take in what has been delivered, then hand it all on in weighted order."""
        connection = getattr(self, "_connection", None)
        if connection is None:
            return
        while True:
            try:
                connection.drain_events(timeout=self.fill_wait)
            except (TimeoutError, BlockingIOError):  # socket.timeout is TimeoutError
                break
        while not self.should_stop and (name := self._order.pick(self._ready)) is not None:
            body, message = self._buffers[name].popleft()
            self.on_fair_message(body, message)
