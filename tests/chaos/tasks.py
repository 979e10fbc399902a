"""The checker's tasks: one under each stack of policies the workload draws from. Every
body journals its start and its end (task id, retries, worker, pid, time) in the journal
Redis, outside the system under test, and returns what it ran for, so a covered message's
result names the run that covered it."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task

from celery_extras import (
    Call,
    ExponentialBackoff,
    batch,
    coalesce,
    concurrency,
    debounce,
    limit,
    retry_policy,
)
from tests.support.journal import Journal

__all__ = ["RATES", "batched", "capped", "coalesced", "debounced", "limited", "plain", "retried"]

#: The limits and caps the checker holds the workers to: task -> (rate per second, burst)
RATES = {"chaos.limited": (20.0, 2), "chaos.several": (15.0, 2)}
CAPS = {"chaos.capped": 3, "chaos.several": 2}


def _key(args: Any, kwargs: Any) -> str:
    return str(args[0])


def _journal(task: Task) -> Journal:
    return Journal(task.app.main or "extras-test")


def _body(task: Task, key: str, tag: Any, seconds: float, fail: bool = False) -> dict[str, Any]:
    journal = _journal(task)
    journal.note(task, phase="start", key=key, tag=tag)
    time.sleep(seconds)
    if fail and task.request.retries == 0:
        journal.note(task, phase="end", key=key, tag=tag, failed=True)
        raise ValueError(f"first attempt of {tag} fails")
    journal.note(task, phase="end", key=key, tag=tag)
    return {"key": key, "tag": tag, "run": task.request.id}


@shared_task(bind=True, name="chaos.plain", acks_late=True)
def plain(self: Task, key: str, tag: Any = None, seconds: float = 0.01) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@limit("20/s", burst=2)
@shared_task(bind=True, name="chaos.limited", acks_late=True)
def limited(self: Task, key: str, tag: Any = None, seconds: float = 0.01) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@limit("15/s", burst=2)
@limit("1000/m", burst=1000)
@concurrency(2, lease=5.0)
@shared_task(bind=True, name="chaos.several", acks_late=True)
def several(self: Task, key: str, tag: Any = None, seconds: float = 0.05) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@concurrency(3, lease=5.0)
@shared_task(bind=True, name="chaos.capped", acks_late=True)
def capped(self: Task, key: str, tag: Any = None, seconds: float = 0.1) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@coalesce(key=_key, lease=5.0)
@shared_task(bind=True, name="chaos.coalesced", acks_late=True)
def coalesced(self: Task, key: str, tag: Any = None, seconds: float = 0.1) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@debounce(0.3, key=_key, max_wait=1.0, lease=5.0)
@shared_task(bind=True, name="chaos.debounced", acks_late=True)
def debounced(self: Task, key: str, tag: Any = None, seconds: float = 0.05) -> dict[str, Any]:
    return _body(self, key, tag, seconds)


@retry_policy(on=(ValueError,), policy=ExponentialBackoff(base=0.2, cap=1.0), max_retries=5)
@shared_task(bind=True, name="chaos.retried", acks_late=True)
def retried(self: Task, key: str, tag: Any = None, seconds: float = 0.02) -> dict[str, Any]:
    return _body(self, key, tag, seconds, fail=True)


@batch(size=5, wait=0.3)
@shared_task(bind=True, name="chaos.batched", acks_late=True)
def batched(self: Task, calls: list[Call]) -> list[Any]:
    """Journals each call's start under the call's id, then the batch's end."""
    journal = _journal(self)
    journal.note_calls(self, calls)
    time.sleep(0.05)
    journal.note(self, phase="end", key="", tag=None, batch=self.request.id,
                 calls=[call.id for call in calls])  # fmt: skip
    return [{"key": c.args[0], "tag": c.args[1], "run": self.request.id} for c in calls]
