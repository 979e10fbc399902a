"""A retry policy's retry is published on a connection of its own when the pooled producer
fails (chaos seed 699640): after a broker restart kombu may leave a pooled producer unusable
(``AttributeError: 'NoneType' object has no attribute 'client'``, 30 s after the broker came
back), and the message, put back to the queue, ran a second time in full.

The task's body runs in this process under a worker-like request (not eager), on the real
Redis broker; the pooled producer's ``publish`` is made to fail as kombu's did."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import Reject, Retry

from celery_extras import ExponentialBackoff, install, retry_policy
from tests.support.brokers import REDIS_URL, require_broker

UNUSABLE = AttributeError("'NoneType' object has no attribute 'client'")


@pytest.fixture
def app() -> Iterator[Celery]:
    require_broker("redis")
    app = install(Celery("retry-publish", broker=REDIS_URL, set_as_current=False))
    app.conf.task_default_queue = f"retry-publish-{uuid.uuid4().hex[:8]}"
    app.conf.task_acks_late = True
    yield app
    redis.Redis.from_url(REDIS_URL).delete(app.conf.task_default_queue)
    app.close()


def _failing(app: Celery) -> Any:
    @retry_policy(on=ValueError, policy=ExponentialBackoff(0.1, 1.0))
    @app.task(name="retry_publish.fails", shared=False)
    def fails() -> None:
        raise ValueError("the first attempt fails")

    app.finalize(auto=True)  # policies apply as the app finalizes
    return app.tasks[fails.name]


@contextmanager
def _unusable_pooled_producer(app: Celery) -> Iterator[list[int]]:
    """Every producer the app's pool lends out fails to publish, as kombu's did; a producer
    the caller brings (Celery's ``producer=``) is left alone. Yields the failures' count."""
    failures: list[int] = []
    acquire = app.producer_or_acquire

    @contextmanager
    def broken(producer: Any = None) -> Iterator[Any]:
        if producer is not None:
            yield producer
            return
        with acquire() as pooled:
            publish = pooled.publish

            def fail(*args: Any, **kwargs: Any) -> None:
                failures.append(1)
                raise UNUSABLE

            pooled.publish = fail
            try:
                yield pooled
            finally:
                pooled.publish = publish

    app.producer_or_acquire = broken  # type: ignore[method-assign]
    try:
        yield failures
    finally:
        del app.producer_or_acquire


def _run_as_a_worker(task: Any) -> None:
    """The task's body as a worker runs it: a request that is neither eager nor direct."""
    task.push_request(id=str(uuid.uuid4()), retries=0, is_eager=False, called_directly=False,
                      delivery_info={"routing_key": task.app.conf.task_default_queue})  # fmt: skip
    try:
        task.run()
    finally:
        task.pop_request()


def test_a_retry_the_pooled_producer_cannot_publish_goes_on_a_new_connection_seed_699640(
    app: Celery,
) -> None:
    task = _failing(app)
    queue = app.conf.task_default_queue
    with _unusable_pooled_producer(app) as failures, pytest.raises(Retry):
        _run_as_a_worker(task)
    assert failures == [1]  # the pooled producer was tried, and failed
    assert redis.Redis.from_url(REDIS_URL).llen(queue) == 1  # the retry is in the queue


def test_a_retry_no_connection_can_publish_puts_its_message_back(app: Celery) -> None:
    """With the broker unreachable on a new connection too, the message goes back to the
    queue (``acks_late``): never lost."""
    task = _failing(app)
    app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens: a new connection fails
    app.conf.broker_connection_timeout = 0.5
    app.conf.broker_connection_max_retries = 0
    with _unusable_pooled_producer(app), pytest.raises(Reject) as rejected:
        _run_as_a_worker(task)
    assert rejected.value.requeue is True
