"""Read each queue's figures on the broker: depth, and the age of its oldest message.

One broker read per queue per call of :meth:`QueueReader.read`:

* **Redis**: one ``EVAL`` per queue (``scripts/queue_oldest.lua``). A kombu queue is a list
  per priority step, published with ``LPUSH`` and taken with ``BRPOP``, so its oldest
  message is the last element of each list; the script sums the lists' lengths and returns
  the smallest publish stamp (:data:`~.queue_stamp.PUBLISHED_HEADER`) of their last
  elements. The age is
  ``now - stamp`` (0 for an empty queue); a message without a stamp (a foreign producer)
  gives no age.
* **RabbitMQ** (``amqp``/``pyamqp``): one passive ``queue.declare`` per queue, whose reply
  tells the messages ready for delivery. RabbitMQ tells no message's age without taking
  the message: the age is not given. A queue that does not exist gives no figures.

Other transports give no figures. Thin glue on kombu's connection; its Redis channel gives
the keys (:func:`~celery_extras.compat.redis_queue_keys`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from .. import compat
from ..scripts import load
from .queue_stamp import PUBLISHED_HEADER

__all__ = ["READABLE", "AmqpReader", "QueueReader", "RedisReader", "reader_for"]

logger = logging.getLogger(__name__)

#: One call per queue (``scripts/queue_oldest.lua``): KEYS are the queue's lists.
OLDEST_SCRIPT = load("queue_oldest")

#: The kombu transports (``driver_type``) whose queues are read.
READABLE = ("redis", "amqp")

#: A queue's figures: ``{"depth": int}`` and, when known, ``"oldest"`` (seconds).
Figures = dict[str, float | int]


class QueueReader:
    """Reads the figures of queues on one broker connection (kombu's)."""

    def __init__(self, connection: Any, clock: Callable[[], float]) -> None:
        self.connection = connection
        self.clock = clock

    def read(self, queues: Iterable[str]) -> dict[str, Figures]:
        """The figures of each of *queues* the broker tells (a queue may be left out)."""
        out: dict[str, Figures] = {}
        for queue in queues:
            figures = self.read_one(queue)
            if figures is not None:
                out[queue] = figures
        return out

    def read_one(self, queue: str) -> Figures | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:
        try:
            self.connection.release()
        except Exception:  # closing a broken connection must not raise
            logger.debug("celery-extras queue figures: closing the connection", exc_info=True)


class RedisReader(QueueReader):
    """Redis: one ``EVAL`` of :data:`OLDEST_SCRIPT` per queue."""

    def read_one(self, queue: str) -> Figures | None:
        channel = self.connection.default_channel
        keys = compat.redis_queue_keys(channel, queue)
        # EVAL: kombu's prefixing client leaves its keys alone (they are prefixed here)
        reply = channel.client.eval(OLDEST_SCRIPT, len(keys), *keys, PUBLISHED_HEADER)
        figures: Figures = {"depth": int(reply[0])}
        if not figures["depth"]:
            figures["oldest"] = 0.0  # nothing waits
        elif len(reply) > 1 and reply[1] is not None:
            stamp = float(reply[1])
            figures["oldest"] = round(max(0.0, self.clock() - stamp), 3)
        return figures


class AmqpReader(QueueReader):
    """RabbitMQ: one passive ``queue.declare`` per queue; no age."""

    def read_one(self, queue: str) -> Figures | None:
        try:
            ok = self.connection.default_channel.queue_declare(queue=queue, passive=True)
        except self.connection.channel_errors:  # not found: the channel is closed, renew it
            self.connection.close()
            return None
        return {"depth": int(ok.message_count)}


def reader_for(connection: Any, clock: Callable[[], float]) -> QueueReader | None:
    """The reader for *connection*'s transport (kombu's), or ``None`` where there is none."""
    driver = getattr(connection.transport, "driver_type", "")
    if driver == "redis":
        return RedisReader(connection, clock)
    if driver == "amqp":
        return AmqpReader(connection, clock)
    return None
