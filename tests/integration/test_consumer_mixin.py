"""FairConsumerMixin on a real kombu connection, on Redis and on RabbitMQ."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kombu import Connection, Exchange, Queue

from celery_extras import FairConsumerMixin


class Recorder(FairConsumerMixin):
    prefetch = 30

    def __init__(self, connection: Connection, queues: dict[Queue, int], stop_after: int) -> None:
        self.connection = connection
        self.queues = queues
        self.stop_after = stop_after
        self.handled: list[str] = []
        self.max_buffered: dict[str, int] = Counter()

    def get_weighted_queues(self) -> dict[Queue, int]:
        return self.queues

    def on_fair_message(self, body: Any, message: Any) -> None:
        for name, n in self.buffered().items():
            self.max_buffered[name] = max(self.max_buffered[name], n)
        self.handled.append(body["queue"])
        message.ack()
        if len(self.handled) >= self.stop_after:
            self.should_stop = True


def test_mixin_shares_the_handler_by_weight(broker: str, ns: str) -> None:
    exchange = Exchange(f"{ns}.x", type="direct")
    queues = {Queue(f"{ns}.a", exchange, routing_key="a", auto_delete=True): 3,
              Queue(f"{ns}.b", exchange, routing_key="b", auto_delete=True): 1}  # fmt: skip
    with Connection(broker) as conn:
        with conn.Producer(serializer="json") as producer:
            for queue in queues:
                queue(conn.default_channel).declare()
                for _ in range(300):
                    producer.publish({"queue": queue.name[-1]}, exchange=exchange,
                                     routing_key=queue.routing_key, declare=[queue])  # fmt: skip
        consumer = Recorder(conn, queues, stop_after=200)
        consumer.run()
        try:
            shares = Counter(consumer.handled)
            print(f"\n{broker.split(':')[0]}: first 200 handled {dict(shares)}")
            assert 2.7 <= shares["a"] / shares["b"] <= 3.3, shares
            assert consumer.max_buffered[f"{ns}.a"] <= 30
            assert consumer.max_buffered[f"{ns}.b"] <= 10
        finally:
            for queue in queues:
                queue(conn.default_channel).delete()
