"""Tasks of the coalescing tests: each run journals its start and its end (one entry, at
the end, with ``start``; plus a ``phase="start"`` entry when asked) on the host's clock, and
returns what it ran with, so every caller's result names the run that covered it."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject

from celery_extras import coalesce, limit

from .journal import Journal

__all__ = ["crashy", "last", "limited", "per_key", "rejecting", "replacing", "retrying"]


def _key(args: Any, kwargs: Any) -> str:
    return str(args[0])


def _run(task: Task, key: str, tag: Any, seconds: float, announce: bool) -> dict[str, Any]:
    journal = Journal(task.app.main or "extras-test")
    start = time.time()
    if announce:
        journal.note(task, phase="start", key=key, tag=tag, start=start)
    time.sleep(seconds)
    journal.note(task, phase="end", key=key, tag=tag, start=start)
    return {"key": key, "tag": tag, "run": task.request.id}


@coalesce(key=_key)
@shared_task(bind=True, name="tests.coalesce.per_key")
def per_key(self: Task, key: str, tag: Any = None, seconds: float = 0.05,
            announce: bool = False) -> dict[str, Any]:  # fmt: skip
    return _run(self, key, tag, seconds, announce)


@coalesce(key=_key, keep="last")
@shared_task(bind=True, name="tests.coalesce.last")
def last(self: Task, key: str, tag: Any = None, seconds: float = 0.05,
         announce: bool = False) -> dict[str, Any]:  # fmt: skip
    return _run(self, key, tag, seconds, announce)


@coalesce(key=_key, lease=3.0)
@shared_task(bind=True, name="tests.coalesce.crashy")
def crashy(self: Task, key: str, tag: Any = None, seconds: float = 0.05,
           announce: bool = False) -> dict[str, Any]:  # fmt: skip
    return _run(self, key, tag, seconds, announce)


@coalesce(key=_key)
@shared_task(bind=True, name="tests.coalesce.retrying", max_retries=2)
def retrying(self: Task, key: str, tag: Any = None) -> dict[str, Any]:
    """Fails twice, retrying after 1 s each time, then succeeds."""
    result = _run(self, key, tag, 0.05, announce=True)
    if self.request.retries < 2:
        raise self.retry(countdown=1)
    return result


@coalesce(key=_key)
@limit("2/s", burst=1)
@shared_task(bind=True, name="tests.coalesce.limited")
def limited(self: Task, key: str, tag: Any = None) -> dict[str, Any]:
    return _run(self, key, tag, 0.01, announce=False)


@coalesce(key=_key)
@shared_task(bind=True, name="tests.coalesce.replacing")
def replacing(self: Task, key: str, tag: Any = None, seconds: float = 7.0) -> Any:
    """Journals its start, then replaces itself with ``tests.sleep(seconds)``: its result,
    and that of what it covered, is the replacement's, *seconds* later."""
    Journal(self.app.main or "extras-test").note(self, phase="start", key=key, tag=tag)
    return self.replace(self.app.signature("tests.sleep", args=(seconds, f"replaced {tag}")))


@coalesce(key=_key)
@shared_task(bind=True, name="tests.coalesce.rejecting", acks_late=True)
def rejecting(self: Task, key: str, tag: Any = None) -> Any:
    """Journals its start, then raises ``Reject`` (not requeued): its message is rejected."""
    Journal(self.app.main or "extras-test").note(self, phase="start", key=key, tag=tag)
    raise Reject("rejected on purpose", requeue=False)
