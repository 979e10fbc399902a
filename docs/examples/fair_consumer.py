"""A plain kombu consumer on weighted fair queues (docs: "Plain kombu consumers");
tests/docs/test_docs_blocks.py runs it."""

from kombu import Connection, Queue

from celery_extras import FairConsumerMixin


def handle(body):
    print("handled", body)


class Worker(FairConsumerMixin):
    prefetch = 20

    def __init__(self, connection):
        self.connection = connection

    def get_weighted_queues(self):
        return {Queue("high"): 3, Queue("low"): 1}

    def on_fair_message(self, body, message):
        handle(body)
        message.ack()


if __name__ == "__main__":
    with Connection("redis://localhost:6379/0") as conn:
        Worker(conn).run()
