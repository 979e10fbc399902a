"""Fair queues: a plain kombu consumer, weights high:3 low:1, shares the handler by weight.

The worker step (``extras_queue_weights``) needs a worker started with several
queues; this demo shows the same weighted order with :class:`FairConsumerMixin`
on the demo's broker, in-process, in about a second.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from celery import Celery
from kombu import Connection, Exchange, Queue

from celery_extras import FairConsumerMixin

__all__ = ["run"]

BACKLOG = 200
HANDLED = 200


class Tally(FairConsumerMixin):
    """Acks each message and counts its queue; stops after *stop_after* messages."""

    prefetch = 20

    def __init__(self, connection: Connection, queues: dict[Queue, int], stop_after: int) -> None:
        self.connection = connection
        self.queues = queues
        self.stop_after = stop_after
        self.handled: Counter[str] = Counter()

    def get_weighted_queues(self) -> dict[Queue, int]:
        return self.queues

    def on_fair_message(self, body: Any, message: Any) -> None:
        self.handled[body["queue"]] += 1
        message.ack()
        if sum(self.handled.values()) >= self.stop_after:
            self.should_stop = True


def run(app: Celery) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    exchange = Exchange(f"example.fair.{tag}", type="direct")
    weights = {"high": 3, "low": 1}
    queues = {Queue(f"example.fair.{tag}.{name}", exchange, routing_key=name, auto_delete=True):
              weight for name, weight in weights.items()}  # fmt: skip
    with Connection(app.conf.broker_url) as conn:
        try:
            with conn.Producer(serializer="json") as producer:
                for queue in queues:
                    body, key = {"queue": queue.routing_key}, queue.routing_key
                    for _ in range(BACKLOG):
                        producer.publish(body, exchange=exchange, routing_key=key, declare=[queue])
            tally = Tally(conn, queues, stop_after=HANDLED)
            tally.run()
        finally:
            for queue in queues:
                queue(conn.default_channel).delete()
    ratio = tally.handled["high"] / max(1, tally.handled["low"])
    if not 2.7 <= ratio <= 3.3:
        raise AssertionError(f"weights high:3 low:1 handled {dict(tally.handled)}")
    return [
        f"{BACKLOG} messages backlogged in each of 'high' (weight 3) and 'low' (weight 1); "
        f"first {HANDLED} handled: {dict(tally.handled)} (ratio {ratio:.2f})",
        "workers: app.conf.extras_queue_weights = {'high': 3, 'low': 1} with -Q high,low",
    ]
