"""celery-batches' own test tasks (``t/integration/tasks.py``), ported to ``batch()``.

``add`` and ``cumadd`` are celery-batches' ``add`` and ``cumadd`` (``flush_every=2``),
returning one result per call instead of calling ``mark_as_done`` for each request;
``acks`` and ``acks_late`` are its ``test_acks_early``/``test_acks_late`` tasks. Each batch
journals its calls (ids, tags, start time, what ``Call`` carried) and the worker's task
signals for these tasks are journaled too, so the tests count them as celery-batches does.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Task, current_app, shared_task, signals

from celery_extras import Call, batch

from .brokers import REDIS_URL

__all__ = ["acks", "acks_late", "add", "cumadd"]

PEER = "tests.batch.peer."


def _write(ns: str, **entry: Any) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.rpush(f"{ns}:journal", json.dumps({"t": time.time(), "pid": os.getpid(), **entry}))
    finally:
        client.close()


def _note(task: Task, calls: list[Call], **fields: Any) -> None:
    """One journal entry for a batch of *task*: its id, its calls and what each carried."""
    _write(
        task.app.main or "extras-test", task=task.name, id=task.request.id, n=len(calls),
        ids=[c.id for c in calls], start=time.time(),
        calls=[{"name": c.name, "hostname": c.hostname, "reply_to": c.reply_to,
                "correlation_id": c.correlation_id, "retries": c.retries, "eta": c.eta,
                "expires": c.expires, "routing_key": c.delivery_info.get("routing_key"),
                "header_id": c.headers.get("id"), "header_task": c.headers.get("task"),
                "custom": c.headers.get("x-peer"), "request_task": c.request_dict["task"]}
               for c in calls],
        **fields,
    )  # fmt: skip


@batch(size=2, wait=1.5)
@shared_task(bind=True, name=f"{PEER}add")
def add(self: Task, calls: list[Call]) -> list[int]:
    """The sum of every argument of every call, for each call (celery-batches' ``add``)."""
    _note(self, calls)
    total = sum(sum(c.args) + sum(c.kwargs.values()) for c in calls)
    return [total] * len(calls)


@batch(size=2, wait=1.5)
@shared_task(bind=True, name=f"{PEER}cumadd")
def cumadd(self: Task, calls: list[Call]) -> list[int]:
    """The running sum of the calls' first arguments (celery-batches' ``cumadd``)."""
    _note(self, calls)
    results, total = [], 0
    for call in calls:
        total += call.args[0]
        results.append(total)
    return results


def _unacked(task: Task) -> int:
    """How many messages of this test's namespace the Redis broker holds unacked now."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return int(client.hlen(f"{task.app.main}.unacked"))
    finally:
        client.close()


@batch(size=2, wait=1.5)
@shared_task(bind=True, name=f"{PEER}acks")
def acks(self: Task, calls: list[Call]) -> None:
    """celery-batches' ``test_acks_early`` task: journals how many messages are unacked
    while it runs (celery-batches acks them before; ``batch()`` after)."""
    _note(self, calls, unacked=_unacked(self))


@batch(size=2, wait=1.5)
@shared_task(bind=True, name=f"{PEER}acks_late", acks_late=True)
def acks_late(self: Task, calls: list[Call]) -> None:
    """celery-batches' ``test_acks_late`` task: nothing acked while it runs."""
    _note(self, calls, unacked=_unacked(self))


def _peer(name: Any) -> bool:
    return isinstance(name, str) and name.startswith(PEER)


def _signal(signal: str, name: Any, ids: list[str], **fields: Any) -> None:
    if _peer(name):
        _write(current_app.main or "extras-test", task="signal", signal=signal, name=name,
               ids=ids, **fields)  # fmt: skip


def _ids(args: Any, task_id: Any) -> list[str]:
    """The ids of a batch's calls (its one argument), or the id of an eager run."""
    if args and isinstance(args[0], list) and all(isinstance(c, Call) for c in args[0]):
        return [c.id for c in args[0]]
    return [str(task_id)]


@signals.task_received.connect
def _received(sender: Any = None, request: Any = None, **_: Any) -> None:
    _signal("task_received", getattr(request, "name", None), [getattr(request, "id", "")])


@signals.task_prerun.connect
def _prerun(sender: Any = None, task: Any = None, task_id: Any = None, args: Any = None,
            **_: Any) -> None:  # fmt: skip
    now = current_app.current_task
    _signal("task_prerun", getattr(task, "name", None), _ids(args, task_id),
            task_id=task_id, current=getattr(now, "name", None))  # fmt: skip


@signals.task_postrun.connect
def _postrun(sender: Any = None, task: Any = None, task_id: Any = None, args: Any = None,
             state: Any = None, **_: Any) -> None:  # fmt: skip
    _signal("task_postrun", getattr(task, "name", None), _ids(args, task_id),
            task_id=task_id, state=state)  # fmt: skip


def _per_call(signal: str) -> Any:
    def receiver(sender: Any = None, **kwargs: Any) -> None:
        request = kwargs.get("request") or getattr(sender, "request", None)
        name = kwargs.get("name") or getattr(sender, "name", None) or getattr(request, "name", None)
        _signal(signal, name, [kwargs.get("task_id") or getattr(request, "id", None) or ""])

    return receiver


_PER_CALL = ("task_success", "task_retry", "task_failure", "task_revoked",
             "task_internal_error", "task_unknown", "task_rejected")  # fmt: skip
_RECEIVERS = {name: _per_call(name) for name in _PER_CALL}
for _name, _receiver in _RECEIVERS.items():
    getattr(signals, _name).connect(_receiver, weak=False)
