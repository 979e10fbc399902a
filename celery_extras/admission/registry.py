"""Where a task's policies are recorded, and how they are found from any task object.

``limit`` and ``retry_policy`` sit above ``@app.task`` or ``@shared_task``, which
return a task, a ``PromiseProxy`` (app not finalized yet) or a ``Proxy`` (shared
task, one real task per app). All three wrap one plain function; the policies
are recorded on that function, so every task made from it, in every app and in
every process, finds them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from celery import Celery, Task
from celery.local import PromiseProxy, Proxy

from ..batch.spec import BatchSpec
from ..coalesce.spec import CoalesceSpec
from ..compat import promise_proxy_parts, shared_task_parts
from ..concurrency.spec import ConcurrencySpec
from ..limits.spec import LimitSpec
from ..retries.spec import RetrySpec

__all__ = ["POLICY_ATTR", "TaskPolicies", "policies_of", "target_of"]

POLICY_ATTR = "__extras_policies__"


@dataclass
class TaskPolicies:
    """The limits, concurrency limit, coalescing, batching and retry policy declared on one
    task function. ``limits`` are in reading order: the top ``limit()`` first."""

    limits: tuple[LimitSpec, ...] = ()
    retry: RetrySpec | None = None
    concurrency: ConcurrencySpec | None = None
    coalesce: CoalesceSpec | None = None
    batch: BatchSpec | None = None

    #: the policies read by a gate of the admission pipeline: a task with any of them
    #: takes the pipeline's path (its strategy is :func:`~.consumer.admitted_strategy`)
    GATED: ClassVar[tuple[str, ...]] = ("coalesce", "limits", "concurrency", "batch")

    def gated(self) -> bool:
        return any(getattr(self, policy) not in (None, ()) for policy in self.GATED)


def _function_of_task(task: Task) -> Callable[..., Any] | None:
    for klass in type(task).__mro__:
        run = klass.__dict__.get("run")
        if run is not None:
            fun = getattr(run, "__func__", run)  # staticmethod for unbound tasks
            return fun if callable(fun) else None
    return None


def target_of(task: Any) -> tuple[Callable[..., Any], str]:
    """``(function, task name)`` behind *task*; :class:`TypeError` if it is not a task.

    Proxies are recognised by their own type: ``isinstance`` would ask the proxy for
    ``__class__`` and so evaluate it against whatever app is current at import time.
    """
    kind = type(task)
    if issubclass(kind, PromiseProxy):  # @app.task before the app is finalized
        args, opts = promise_proxy_parts(task)
        if args and callable(args[0]):
            fun = args[0]
            return fun, opts.get("name") or f"{fun.__module__}.{fun.__name__}"
    elif issubclass(kind, Proxy):  # @shared_task
        fun, name = shared_task_parts(task)
        if fun is not None:
            return fun, name or f"{fun.__module__}.{fun.__name__}"
    elif isinstance(task, Task):
        fun = _function_of_task(task)
        if fun is not None:
            return fun, str(task.name)
    raise TypeError(
        f"{task!r} is not a Celery task: put limit()/retry_policy() above @app.task or "
        "@shared_task (concurrency() and coalesce() too)"
    )


def policies_of(task: Task) -> TaskPolicies | None:
    """The policies declared on *task*'s function, or ``None``."""
    fun = _function_of_task(task)
    found = getattr(fun, POLICY_ATTR, None) if fun is not None else None
    return found if isinstance(found, TaskPolicies) else None


def record(fun: Callable[..., Any]) -> TaskPolicies:
    """The (new or existing) policies record of *fun*."""
    found = getattr(fun, POLICY_ATTR, None)
    if not isinstance(found, TaskPolicies):
        found = TaskPolicies()
        setattr(fun, POLICY_ATTR, found)
    return found


def tasks_made_from(app: Celery, fun: Callable[..., Any]) -> list[Task]:
    """The tasks of a finalized *app* whose function is *fun*."""
    return [t for t in app.tasks.values() if _function_of_task(t) is fun]
