"""Tasks of ``tests/integration/test_green_resume.py``: each run journals its tag and the
depth of its stack as it ends (a run started inside the ending of another, as eventlet's
``spawn`` does from a pool greenlet when the pool is full, is deeper than the first)."""

from __future__ import annotations

import sys
import time
from types import FrameType
from typing import Any

from celery import Task, shared_task

from celery_extras import coalesce, concurrency

from .journal import Journal

__all__ = ["coalesced", "one", "plain", "two"]


def _depth() -> int:
    """Frames on this thread's (greenlet's) stack."""
    frame: FrameType | None = sys._getframe()
    depth = 0
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return depth


def _run(task: Task, tag: Any, seconds: float, announce: bool = False) -> Any:
    journal = Journal(task.app.main or "extras-test")
    if announce:
        journal.note(task, phase="start", tag=tag)
    time.sleep(seconds)
    journal.note(task, phase="end", tag=tag, depth=_depth())
    return tag


@concurrency(1)
@shared_task(bind=True, name="tests.green.one", ignore_result=True)
def one(self: Task, tag: Any = None, seconds: float = 0.1) -> Any:
    return _run(self, tag, seconds)


@concurrency(2)
@shared_task(bind=True, name="tests.green.two", ignore_result=True)
def two(self: Task, tag: Any = None, seconds: float = 0.1) -> Any:
    return _run(self, tag, seconds)


@shared_task(bind=True, name="tests.green.plain", ignore_result=True)
def plain(self: Task, tag: Any = None, seconds: float = 0.1) -> Any:
    """No policy: a capped queue's gate routes it through the pipeline."""
    return _run(self, tag, seconds)


@coalesce(key=lambda args, kwargs: "k")
@shared_task(bind=True, name="tests.green.coalesced")
def coalesced(self: Task, tag: Any = None, seconds: float = 0.1, announce: bool = False) -> Any:
    return _run(self, tag, seconds, announce)
