"""Tasks of the memoize tests: each run journals itself and returns what it ran with and its
own id, so every caller's result names the run that made it."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task

from celery_extras import memoize

from .journal import Journal

__all__ = ["bounded", "flaky", "record", "short", "square", "tsum"]


def _run(task: Task, x: Any, seconds: float) -> dict[str, Any]:
    Journal(task.app.main or "extras-test").note(task, phase="run", x=x)
    time.sleep(seconds)
    return {"x": x, "run": task.request.id}


@memoize(30.0)
@shared_task(bind=True, name="tests.memoize.square")
def square(self: Task, x: Any, seconds: float = 0.05) -> dict[str, Any]:
    """Keyed by its arguments (the default)."""
    return _run(self, x, seconds)


@memoize(30.0)
@shared_task(bind=True, name="tests.memoize.flaky")
def flaky(self: Task, x: Any) -> dict[str, Any]:
    """Fails on its first run of *x*, then succeeds."""
    journal = Journal(self.app.main or "extras-test")
    runs = [e for e in journal.entries() if e["task"] == self.name and e.get("x") == x]
    result = _run(self, x, 0.05)
    if not runs:
        raise ValueError(f"first run of {x} fails")
    return result


@memoize(1.0)
@shared_task(bind=True, name="tests.memoize.short")
def short(self: Task, x: Any) -> dict[str, Any]:
    """Its results kept one second."""
    return _run(self, x, 0.05)


@memoize(30.0, key=lambda args, kwargs: f"{args[0]}", max_keys=3)
@shared_task(bind=True, name="tests.memoize.bounded")
def bounded(self: Task, x: Any) -> dict[str, Any]:
    """At most 3 keys kept."""
    return _run(self, x, 0.05)


@shared_task(bind=True, name="tests.memoize.record")
def record(self: Task, value: Any, tag: Any) -> Any:
    """A callback (``record.s(tag)``): journals that it ran, and the *value* it was given."""
    Journal(self.app.main or "extras-test").note(self, phase="callback", tag=tag, given=value)
    return tag


@shared_task(name="tests.memoize.tsum")
def tsum(values: list[dict[str, Any]]) -> list[Any]:
    """A chord body: the runs its parts' results name."""
    return sorted(value["run"] for value in values)
