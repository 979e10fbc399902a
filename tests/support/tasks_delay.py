"""Tasks of the delay store tests: limited, countdown and retried tasks that journal each run."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from celery_extras import ExponentialBackoff, limit, retry_policy

from .journal import Journal
from .tasks_eta import eta_task

__all__ = ["eta_task", "limited10", "limited20", "limited40", "long_retry"]


def _note(task: Task, **fields: Any) -> None:
    Journal(task.app.main or "extras-test").note(task, **fields)


@limit("40/s", burst=1, scope="global")
@shared_task(bind=True, name="tests.delay.limited40", acks_late=True)
def limited40(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("20/s", burst=1, scope="global")
@shared_task(bind=True, name="tests.delay.limited20", acks_late=True)
def limited20(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("10/s", burst=1, scope="global")
@shared_task(bind=True, name="tests.delay.limited10")
def limited10(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@retry_policy(on=(ValueError,), policy=ExponentialBackoff(base=8.0, cap=8.0), max_retries=3)
@shared_task(bind=True, name="tests.delay.long_retry", acks_late=True)
def long_retry(self: Task, tag: Any = None) -> Any:
    """Fails once, then succeeds: its one retry waits 8 s (beyond a 5 s visibility timeout)."""
    _note(self, tag=tag)
    if self.request.retries < 1:
        raise ValueError(f"{tag} fails once")
    return tag
