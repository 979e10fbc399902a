"""Tasks of the concurrency tests: each journals its start and end (one entry, written at the
end so that the journal's own write adds nothing to the run) on the host's clock."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Ignore, Reject

from celery_extras import coalesce, concurrency, limit

from .journal import Journal

__all__ = ["all_gates", "crash2", "endings", "global2", "per_key1", "roomy"]


def _run(task: Task, seconds: float, **fields: Any) -> None:
    journal = Journal(task.app.main or "extras-test")
    start = time.time()
    if fields.get("tag") == "block":  # the test waits for it to hold its slot
        journal.note(task, phase="start", **fields)
        journal.wait_for_flag("go")
    time.sleep(seconds)
    journal.note(task, phase="end", start=start, **fields)


@concurrency(2)
@shared_task(bind=True, name="tests.concurrency.global2", ignore_result=True)
def global2(self: Task, tag: Any = None, seconds: float = 0.2) -> Any:
    _run(self, seconds, tag=tag)
    return tag


@concurrency(1, key=lambda args, kwargs: args[0])
@shared_task(bind=True, name="tests.concurrency.per_key1")
def per_key1(self: Task, customer: str, tag: Any = None) -> Any:
    _run(self, 0.2, tag=tag, customer=customer)
    return tag


@concurrency(1000, scope="global")
@shared_task(bind=True, name="tests.concurrency.roomy", ignore_result=True)
def roomy(self: Task, tag: Any = None) -> Any:
    """A global cap far from binding: a slot a run frees is kept for the worker's next."""
    _run(self, 0.0, tag=tag)
    return tag


@concurrency(2, lease=3.0)
@shared_task(bind=True, name="tests.concurrency.crash2", acks_late=True)
def crash2(self: Task, tag: Any = None) -> Any:
    _run(self, 0.2, tag=tag)
    return tag


@concurrency(1, lease=5.0)
@shared_task(bind=True, name="tests.concurrency.endings", max_retries=1)
def endings(self: Task, how: str, tag: Any = None) -> Any:
    """End as *how* says: ok, fail, retry (once), reject, ignore, sleep (for a time limit),
    block (until the flag ``go``, for revoke and terminate)."""
    journal = Journal(self.app.main or "extras-test")
    journal.note(self, phase="start", how=how, tag=tag)
    if how == "fail":
        raise ValueError("fails")
    if how == "retry" and not self.request.retries:
        raise self.retry(countdown=0)
    if how == "reject":
        raise Reject("rejected", requeue=False)
    if how == "ignore":
        raise Ignore()
    if how == "sleep":
        time.sleep(30)
    if how == "block":
        journal.wait_for_flag("go")
    journal.note(self, phase="end", how=how, tag=tag)
    return tag


@limit("1000/s", scope="global")
@concurrency(2, scope="global")
@coalesce(key=lambda args, kwargs: args[0])
@shared_task(bind=True, name="tests.concurrency.all_gates")
def all_gates(self: Task, key: str, tag: Any = None) -> Any:
    """The three store-backed gates on one task: one store round trip as it arrives, one as
    it ends."""
    _run(self, 0.05, key=key, tag=tag)
    return tag
