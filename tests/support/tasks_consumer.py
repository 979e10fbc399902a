"""Tasks of the fair-queue tests: a short task that journals its queue and its publish time."""

from __future__ import annotations

import time

from celery import Task, shared_task

from .journal import Journal

__all__ = ["work"]


@shared_task(bind=True, name="tests.consumer.work")
def work(self: Task, queue: str, published: float, seconds: float = 0.02) -> None:
    """Journal ``queue`` and ``waited`` (publish to start), then sleep *seconds*."""
    now = time.time()
    Journal(self.app.main or "extras-test").note(self, queue=queue, waited=now - published)
    time.sleep(seconds)
