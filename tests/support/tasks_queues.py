"""Tasks of the per-queue concurrency tests: each journals one ``end`` entry with its start,
its queue (an argument: a task does not know its queue) and its tag."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task

from celery_extras import limit

from .journal import Journal

__all__ = ["limited_work", "work"]


def _run(task: Task, queue: str, tag: Any, seconds: float) -> None:
    start = time.time()
    time.sleep(seconds)
    Journal(task.app.main or "extras-test").note(task, phase="end", start=start, queue=queue,
                                                 tag=tag)  # fmt: skip


@shared_task(bind=True, name="tests.queues.work", ignore_result=True)
def work(self: Task, queue: str, tag: Any = None, seconds: float = 0.3) -> None:
    """No policy: Celery's own strategy, routed through admission for a capped queue."""
    _run(self, queue, tag, seconds)


@limit("1000/s", scope="worker")
@shared_task(bind=True, name="tests.queues.limited_work", ignore_result=True)
def limited_work(self: Task, queue: str, tag: Any = None, seconds: float = 0.3) -> None:
    """A policy of its own: the queue's gate is one more of its chain."""
    _run(self, queue, tag, seconds)
