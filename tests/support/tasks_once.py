"""Tasks of the "no body runs twice" tests: one task under each policy that covers, holds or
gates a message, every body journalling its start under its task id (a batch: each of its
calls' ids), so a test counts bodies per id, not runs per key."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task

from celery_extras import Call, batch, coalesce, concurrency, debounce, limit

from .journal import Journal

__all__ = ["batched", "capped", "coalesced", "debounced", "limited"]


def _key(args: Any, kwargs: Any) -> str:
    return str(args[0])


def _body(task: Task, key: str, tag: Any, seconds: float) -> dict[str, Any]:
    Journal(task.app.main or "extras-test").note(task, phase="start", key=key, tag=tag)
    time.sleep(seconds)
    return {"key": key, "tag": tag, "run": task.request.id}


@coalesce(key=_key)
@shared_task(bind=True, name="tests.once.coalesced")
def coalesced(self: Task, key: str, tag: Any = None, seconds: float = 0.1) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@debounce(0.3, key=_key, max_wait=1.0, lease=5.0)
@shared_task(bind=True, name="tests.once.debounced")
def debounced(self: Task, key: str, tag: Any = None, seconds: float = 0.1) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@limit("40/s", burst=4)
@shared_task(bind=True, name="tests.once.limited")
def limited(self: Task, key: str, tag: Any = None, seconds: float = 0.02) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@concurrency(2, key=_key)
@shared_task(bind=True, name="tests.once.capped")
def capped(self: Task, key: str, tag: Any = None, seconds: float = 0.05) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@batch(size=8, wait=0.2)
@shared_task(bind=True, name="tests.once.batched")
def batched(self: Task, calls: list[Call]) -> list[Any]:
    Journal(self.app.main or "extras-test").note_calls(self, calls)
    time.sleep(0.05)
    return [call.args[1] for call in calls]
