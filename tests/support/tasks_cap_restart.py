"""The task of the cap-through-a-broker-restart test (tests/reliability/test_cap_restart.py):
a cluster-wide ``concurrency(2)`` whose body runs until the test raises a flag."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from celery_extras import concurrency

from .journal import Journal

__all__ = ["held"]


@concurrency(2, lease=5.0)
@shared_task(bind=True, name="tests.cap_restart.held", acks_late=True)
def held(self: Task, tag: Any = None) -> Any:
    """Journals its start, runs until flag ``go`` is raised, journals its end."""
    journal = Journal(self.app.main or "extras-test")
    journal.note(self, phase="start", tag=tag)
    journal.wait_for_flag("go", timeout=120.0)
    journal.note(self, phase="end", tag=tag)
    return tag
