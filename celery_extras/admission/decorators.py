"""The machinery of every policy's decorator: stacked above ``@app.task`` / ``@shared_task``.

A policy's decorator (``limit()``, ``coalesce()``... in the policy's own folder) is made
with :func:`recording`: it checks its arguments at once (errors name the task and the
argument), records the policy's spec on the task's function (see :mod:`.registry`) and
applies it to the tasks already made from that function in every app celery-extras is
installed on; apps finalized later apply it as they finalize (:func:`apply_to_task`: the
admission strategy where a gate acts, each policy's own ``apply``).

Misuse fails at import, naming the fix (:func:`refuses_bare`: ``@limit`` without its
arguments; ``refuses_rate_limit``: a policy stacked over Celery's own ``rate_limit``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from celery import Celery, Task

from .consumer import admitted_strategy
from .registry import TaskPolicies, policies_of, rate_limit_of, record, target_of, tasks_made_from
from .spec import PolicyError
from .uninstalled import connect

__all__ = ["apply_policies", "apply_to_task", "recording", "refuses_bare", "track_app"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

_apps: weakref.WeakSet[Celery] = weakref.WeakSet()
connect()  # an app without install(app) refuses to start its worker, warns when it sends
#: The strategy of a task a gate acts on (by name, as Celery takes it).
_STRATEGY = f"{admitted_strategy.__module__}:{admitted_strategy.__name__}"


def refuses_bare(example: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a policy's decorator fail when used bare (``@limit`` without parentheses: called
    with the task as its first argument), which would silently replace the task with the
    decorator; the error shows *example*, the decorator with its arguments."""

    def wrap(make: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(make)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            if args and callable(args[0]):  # callable() evaluates no task proxy
                try:
                    what = f"on task {target_of(args[0])[1]!r}"
                except TypeError:
                    what = f"on {args[0]!r}"
                raise TypeError(
                    f"@{make.__name__} {what} is used bare: use @{make.__name__}(...) with its "
                    f"arguments, e.g. {example}"
                )
            return make(*args, **kwargs)

        return checked

    return wrap


def recording(
    policy: str, build: Callable[[str, TaskPolicies], Any], refuses_rate_limit: str = ""
) -> Callable[[T], T]:
    """A decorator recording ``build(task name, policies declared so far)`` as the task's
    *policy* and applying it in every app already finalized (checked now: errors name the
    task and the argument). *refuses_rate_limit* (the decorator's name, ``"limit()"``): the
    task must not also have Celery's own ``rate_limit``, as the two would both hold."""

    def decorate(task: T) -> T:
        fun, name = target_of(task)
        rate_limit = rate_limit_of(task) if refuses_rate_limit else None
        if rate_limit is not None:
            raise PolicyError(
                f"{refuses_rate_limit} on task {name!r}: the task also has Celery's "
                f"rate_limit={rate_limit!r}; do not combine them (both would hold, Celery's per "
                f"worker): remove rate_limit= from its @app.task / @shared_task"
            )
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
