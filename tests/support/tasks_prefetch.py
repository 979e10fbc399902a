"""Tasks of the prefetch-window tests: one that runs until the test raises its flag, and a
batched one whose calls wait in the worker (held: the window widened for each)."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from celery_extras import Call, batch

from .journal import Journal

__all__ = ["batched", "hold"]


@shared_task(bind=True, name="tests.prefetch.hold", acks_late=True)
def hold(self: Task, flag: str) -> str:
    """Journals its start, then runs until the test raises flag *flag*."""
    journal = Journal(self.app.main or "extras-test")
    journal.note(self, phase="start", flag=flag)
    journal.wait_for_flag(flag, timeout=120.0)
    return flag


@batch(size=50, wait=3.0)
@shared_task(bind=True, name="tests.prefetch.batched", acks_late=True)
def batched(self: Task, calls: list[Call]) -> list[Any]:
    return [call.args[0] for call in calls]
