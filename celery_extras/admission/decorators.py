"""The machinery of every policy's decorator: stacked above ``@app.task`` / ``@shared_task``.

A policy's decorator (``limit()``, ``coalesce()``... in the policy's own folder) is made
with :func:`recording`: it checks its arguments at once (errors name the task and the
argument), records the policy's spec on the task's function (see :mod:`.registry`) and
applies it to the tasks already made from that function in every app celery-extras is
installed on; apps finalized later apply it as they finalize (:func:`apply_to_task`: the
admission strategy where a gate acts, each policy's own ``apply``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Celery, Task

from .consumer import admitted_strategy
from .registry import TaskPolicies, policies_of, record, target_of, tasks_made_from

__all__ = ["apply_policies", "apply_to_task", "recording", "track_app"]

T = TypeVar("T")

_apps: weakref.WeakSet[Celery] = weakref.WeakSet()
#: The strategy of a task a gate acts on (by name, as Celery takes it).
_STRATEGY = f"{admitted_strategy.__module__}:{admitted_strategy.__name__}"


def recording(policy: str, build: Callable[[str, TaskPolicies], Any]) -> Callable[[T], T]:
    """A decorator recording ``build(task name, policies declared so far)`` as the task's
    *policy* and applying it in every app already finalized (checked now: errors name the
    task and the argument)."""

    def decorate(task: T) -> T:
        fun, name = target_of(task)
        declared = record(fun)
        declared.specs[policy] = build(name, declared)
        _apply_everywhere(fun)
        return task

    return decorate


def apply_to_task(task: Task) -> None:
    """Give *task* the strategy and wrappers its recorded policies need (idempotent)."""
    policies = policies_of(task)
    if policies is None:
        return
    if policies.gated() and task.__dict__.get("Strategy") != _STRATEGY:
        task._extras_strategy = task.Strategy
        task.Strategy = _STRATEGY
    for policy in policies.declared():
        if policy.apply is not None:
            policy.apply(task, policies.specs[policy.name])


def apply_policies(sender: Celery, **kwargs: Any) -> None:
    """Apply recorded policies to every task of a finalized app (``on_after_finalize``)."""
    for task in list(sender.tasks.values()):  # finalized: no second finalize
        apply_to_task(task)


def track_app(app: Celery) -> None:
    """Apply policies in *app*, now if it is finalized and on every later decoration."""
    _apps.add(app)
    if app.finalized:
        apply_policies(app)
    else:
        app.on_after_finalize.connect(apply_policies, sender=app, weak=False)


def _apply_everywhere(fun: Callable[..., Any]) -> None:
    for app in list(_apps):
        if app.finalized:
            for task in tasks_made_from(app, fun):
                apply_to_task(task)
