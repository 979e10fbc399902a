"""Tasks of the stats tests: each has a known outcome (success, failure, retry, reject)."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject

__all__ = ["fails", "rejects", "retries_once", "revoked", "succeeds"]


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
