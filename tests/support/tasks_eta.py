"""A countdown task with no policy: an app of this module alone parks nothing unless
``extras_eta_store`` is on (the delay tests include it through ``tasks_delay``)."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from .journal import Journal

__all__ = ["eta_task"]


@shared_task(bind=True, name="tests.delay.eta_task", acks_late=True)
def eta_task(self: Task, tag: Any = None, due: float = 0.0) -> Any:
    """Journals its start beside the time it was due (``due``, epoch seconds)."""
    Journal(self.app.main or "extras-test").note(self, tag=tag, due=due)
    return tag
