"""Tasks of the stats tests: each has a known outcome (success, failure, retry, reject)."""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Task, shared_task
from celery.exceptions import Ignore, Reject

from celery_extras import ExponentialBackoff, limit, retry_policy

from .brokers import REDIS_URL

__all__ = [
    "autoretries",
    "blocks",
    "exits",
    "exits_late",
    "exits_late_requeued",
    "fails",
    "hard_limit",
    "ignores",
    "limited",
    "policy_retries",
    "rejects",
    "retries_exc",
    "retries_once",
    "revoked",
    "soft_limit",
    "succeeds",
]


def first_run(task: Task) -> bool:
    """True on the first run of this task id (across deliveries and retries), in Redis."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return bool(client.set(f"tests.stats.ran:{task.request.id}", 1, nx=True, ex=600))
    finally:
        client.close()


def exit_once_accepted(task: Task) -> None:
    """Kill this pool child, once its worker has read that it started the task.

    A child that dies before its parent reads the "accepted" note is not a lost job to
    billiard: the job is written again to another child, on the same delivery (one
    ``received``, no rejection). Waiting until ``inspect active`` lists the task makes
    the ending the one the test names.
    """
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        replies = task.app.control.inspect([task.request.hostname], timeout=1).active() or {}
        if any(t["id"] == task.request.id for ts in replies.values() for t in ts):
            break
    os._exit(3)


@shared_task(name="tests.stats.succeeds")
def succeeds(x: Any = None) -> Any:
    return x


@shared_task(name="tests.stats.fails")
def fails() -> None:
    raise ValueError("stats test failure")


@shared_task(bind=True, name="tests.stats.retries_once", max_retries=3)
def retries_once(self: Task) -> str:
    """Retry at once on the first run, succeed on the second."""
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return "retried"


@shared_task(name="tests.stats.rejects")
def rejects() -> None:
    raise Reject("stats test reject", requeue=False)


@shared_task(name="tests.stats.revoked")
def revoked() -> None:
    """Sent only after its id was revoked: never runs."""
    raise AssertionError("a revoked task ran")


@shared_task(bind=True, name="tests.stats.retries_exc", max_retries=3)
def retries_exc(self: Task) -> str:
    """``raise self.retry(exc=...)`` on the first run, succeed on the second."""
    if self.request.retries == 0:
        raise self.retry(exc=ValueError("transient"), countdown=0)
    return "retried"


@shared_task(
    bind=True,
    name="tests.stats.autoretries",
    autoretry_for=(KeyError,),
    max_retries=3,
    default_retry_delay=0,
)
def autoretries(self: Task) -> str:
    """``autoretry_for``: a KeyError on the first run, success on the second."""
    if self.request.retries == 0:
        raise KeyError("transient")
    return "retried"


@retry_policy(on=(ConnectionError,), policy=ExponentialBackoff(base=0.01, cap=0.05))
@shared_task(bind=True, name="tests.stats.policy_retries")
def policy_retries(self: Task) -> str:
    """``retry_policy``: a ConnectionError on the first run, success on the second."""
    if self.request.retries == 0:
        raise ConnectionError("transient")
    return "retried"


@shared_task(name="tests.stats.ignores")
def ignores() -> None:
    raise Ignore()


@shared_task(name="tests.stats.blocks")
def blocks(seconds: float = 60.0) -> None:
    """Runs until terminated (revoke with terminate), or *seconds*."""
    time.sleep(seconds)


@shared_task(name="tests.stats.soft_limit", soft_time_limit=0.3)
def soft_limit() -> None:
    time.sleep(10)  # SoftTimeLimitExceeded is raised in here


@shared_task(name="tests.stats.hard_limit", time_limit=0.5)
def hard_limit() -> None:
    time.sleep(10)  # the pool kills the child


@shared_task(bind=True, name="tests.stats.exits")
def exits(self: Task) -> None:
    """The child dies: WorkerLostError, acked on receipt, so a failure."""
    exit_once_accepted(self)


@shared_task(bind=True, name="tests.stats.exits_late", acks_late=True, reject_on_worker_lost=False)
def exits_late(self: Task) -> None:
    """The child dies with acks_late: a failure (the message is acked)."""
    exit_once_accepted(self)


@shared_task(
    bind=True, name="tests.stats.exits_late_requeued", acks_late=True, reject_on_worker_lost=True
)
def exits_late_requeued(self: Task) -> str:
    """The child dies on the first delivery: requeued (rejected), then succeeds."""
    if first_run(self):
        exit_once_accepted(self)
    return "second delivery"


@limit("5/s", burst=1, scope="global")
@shared_task(name="tests.stats.limited")
def limited(x: Any = None) -> Any:
    """Limited: with ``extras_limit_max_hold`` small, most are parked in the delay store."""
    return x
