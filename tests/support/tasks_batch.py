"""Tasks of the batching tests: each batch journals one entry (its calls' ids and tags, on
the host's clock) and returns one result per call, so batch sizes, the calls each caller's
result came from, and "done exactly once" are read from the journal and the results."""

from __future__ import annotations

import threading
import time
from typing import Any

from celery import Task, current_task, shared_task, signals

from celery_extras import Call, batch, limit

from .journal import Journal

__all__ = [
    "doubled",
    "failing",
    "huge",
    "limited",
    "mixed",
    "odd",
    "retrying",
    "slow",
    "total",
    "unpicklable",
]


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


@batch(size=4, wait=0.5)
@shared_task(bind=True, name="tests.batch.odd")
def odd(self: Task, calls: list[Call]) -> list[Any]:
    """Journals the task ``current_task`` is; the call tagged ``"bad"`` gets an item no JSON
    encoder takes (its caller alone fails with ``EncodeError``), the others their tag."""
    now = current_task._get_current_object() if current_task else None
    _note(self, calls, current=getattr(now, "name", None), phase="body")
    return [object() if c.args[0] == "bad" else c.args[0] for c in calls]


@signals.task_prerun.connect
def _odd_prerun(task: Task | None = None, task_id: str | None = None, args: Any = None,
                **_: Any) -> None:  # fmt: skip
    """``task_prerun`` for a batch of ``odd``: journaled with the batch's request."""
    if task is not None and task.name == "tests.batch.odd":
        _note(task, args[0], phase="prerun", task_id=task_id)


@signals.task_postrun.connect
def _odd_postrun(task: Task | None = None, task_id: str | None = None, args: Any = None,
                 state: str | None = None, **_: Any) -> None:  # fmt: skip
    """``task_postrun`` for a batch of ``odd``: journaled with its state."""
    if task is not None and task.name == "tests.batch.odd":
        _note(task, args[0], phase="postrun", task_id=task_id, state=state)


@batch(size=3, wait=0.5)
@shared_task(bind=True, name="tests.batch.unpicklable", acks_late=True,
             reject_on_worker_lost=True)  # fmt: skip
def unpicklable(self: Task, calls: list[Call]) -> list[Any]:
    """Returns locks: a prefork pool process cannot pickle them back to the worker."""
    _note(self, calls)
    return [threading.Lock() for _ in calls]


@batch(size=2000, wait=60.0)
@shared_task(bind=True, name="tests.batch.huge")
def huge(self: Task, calls: list[Call]) -> list[Any]:
    """Journals when its batch ran and returns each call's tag."""
    _note(self, calls, start=time.time())
    return [c.args[0] for c in calls]


@batch(size=5, wait=1.0)
@shared_task(bind=True, name="tests.batch.mixed", max_retries=2)
def mixed(self: Task, calls: list[Call]) -> list[Any]:
    """Per-call outcomes (issue 51): the call tagged ``"bad"`` fails alone with
    ``ValueError``, the one tagged ``"again"`` is retried alone once (0.5 s later), every
    other call gets its tag; journals its calls' tags and retries."""
    _note(self, calls, retries=[c.retries for c in calls])
    return [
        ValueError(f"bad document in a batch of {len(calls)}") if c.args[0] == "bad"
        else Call.retry(countdown=0.5) if c.args[0] == "again" and not c.retries
        else c.args[0]
        for c in calls
    ]  # fmt: skip
