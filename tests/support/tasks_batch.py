"""Tasks of the batching tests: each batch journals one entry (its calls' ids and tags, on
the host's clock) and returns one result per call, so batch sizes, the calls each caller's
result came from, and "done exactly once" are read from the journal and the results."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task

from celery_extras import Call, batch, limit

from .journal import Journal

__all__ = ["doubled", "failing", "limited", "retrying", "slow", "total"]


def _note(task: Task, calls: list[Call], **fields: Any) -> None:
    Journal(task.app.main or "extras-test").note(
        task, n=len(calls), ids=[c.id for c in calls], tags=[c.args[0] for c in calls], **fields
    )


@batch(size=50, wait=2.0)
@shared_task(bind=True, name="tests.batch.doubled")
def doubled(self: Task, calls: list[Call]) -> list[Any]:
    _note(self, calls, start=time.time())
    return [c.args[0] * 2 for c in calls]


@batch(size=30, wait=1.0)
@shared_task(bind=True, name="tests.batch.slow", acks_late=True)
def slow(self: Task, calls: list[Call]) -> list[Any]:
    """Says it started, sleeps 3 s (a SIGKILL's window), then journals the batch as done."""
    _note(self, calls, phase="start")
    time.sleep(3.0)
    _note(self, calls, phase="done")
    return [c.args[0] for c in calls]


@batch(size=10, wait=0.5)
@shared_task(bind=True, name="tests.batch.failing")
def failing(self: Task, calls: list[Call]) -> list[Any]:
    _note(self, calls)
    raise ValueError(f"boom in a batch of {len(calls)}")


@batch(size=10, wait=0.5)
@shared_task(bind=True, name="tests.batch.retrying", max_retries=3)
def retrying(self: Task, calls: list[Call]) -> list[Any]:
    """Retries its first batch (every call once, after 0.5 s), then doubles."""
    _note(self, calls, retries=[c.headers.get("retries") for c in calls])
    if any(not c.headers.get("retries") for c in calls):
        raise self.retry(countdown=0.5)
    return [c.args[0] * 2 for c in calls]


@limit("20/s", burst=1)
@batch(size=10, wait=0.5)
@shared_task(bind=True, name="tests.batch.limited")
def limited(self: Task, calls: list[Call]) -> list[Any]:
    """Each call takes its token (20/s) before it joins a batch."""
    _note(self, calls, start=time.time())
    return [c.args[0] for c in calls]


@shared_task(name="tests.batch.total")
def total(values: list[int]) -> int:
    return sum(values)
