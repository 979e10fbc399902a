"""Tasks every integration test may use; each run is written to the namespace's journal."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task

from .journal import Journal

__all__ = ["fail", "noop", "sleep"]


def _journal(task: Task) -> Journal:
    return Journal(task.app.main or "extras-test")


@shared_task(bind=True, name="tests.noop")
def noop(self: Task, tag: Any = None) -> Any:
    """Return *tag*; journal the run."""
    _journal(self).note(self, tag=tag)
    return tag


@shared_task(bind=True, name="tests.sleep")
def sleep(self: Task, seconds: float, tag: Any = None) -> Any:
    """Sleep *seconds*; journal the start."""
    _journal(self).note(self, tag=tag)
    time.sleep(seconds)
    return tag


@shared_task(bind=True, name="tests.fail")
def fail(self: Task, message: str = "boom") -> None:
    """Raise ``ValueError(message)``; journal the run."""
    _journal(self).note(self, tag=message)
    raise ValueError(message)
