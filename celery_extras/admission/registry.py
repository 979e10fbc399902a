"""Where a task's policies are recorded, and how they are found from any task object.

A policy's decorator sits above ``@app.task`` or ``@shared_task``, which
return a task, a ``PromiseProxy`` (app not finalized yet) or a ``Proxy`` (shared
task, one real task per app). All three wrap one plain function; the policies
are recorded on that function, so every task made from it, in every app and in
every process, finds them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from celery.local import PromiseProxy, Proxy

from ..compat import promise_proxy_parts, shared_task_parts
from .policy import Policy, policy_named, registered

__all__ = ["POLICY_ATTR", "TaskPolicies", "policies_of", "rate_limit_of", "target_of"]

POLICY_ATTR = "__extras_policies__"


class TaskPolicies:
    """The specs of the policies declared on one task function, by policy name: read as
    attributes (``policies.coalesce``; a policy declared nowhere reads as ``None``, or
    ``()`` for one that stacks, as ``limits`` do, top first)."""

    def __init__(self, **specs: Any) -> None:
        self.specs: dict[str, Any] = dict(specs)

    def __getattr__(self, name: str) -> Any:
        policy = policy_named(name) if not name.startswith("_") else None
        if policy is None:
            raise AttributeError(f"{type(self).__name__} has no policy {name!r}")
        return self.specs.get(name, policy.empty)

    def __repr__(self) -> str:
        return f"TaskPolicies({', '.join(f'{k}={v!r}' for k, v in self.specs.items())})"

    def declared(self) -> list[Policy]:
        """The policies this task declares, in the pipeline's order."""
        return [p for p in registered() if self.specs.get(p.name) not in (None, ())]

    def gated(self) -> bool:
        """Whether a gate of the admission pipeline acts on this task (then its strategy is
        :func:`~.consumer.admitted_strategy`)."""
        return any(p.gate is not None for p in self.declared())


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
        f"@shared_task (as every policy: "
        f"{', '.join(p.decorator for p in registered() if p.decorator.endswith('()'))})"
    )


def rate_limit_of(task: Any) -> Any:
    """Celery's own ``rate_limit`` given to *task* (``@app.task(rate_limit=...)``), or ``None``:
    read from a pending ``@app.task`` proxy's options or a task's class, never evaluating a
    proxy (a ``@shared_task`` proxy's options are not known before an app makes it)."""
    kind = type(task)
    if issubclass(kind, PromiseProxy):
        return promise_proxy_parts(task)[1].get("rate_limit")
    if not issubclass(kind, Proxy) and isinstance(task, Task):
        return task.rate_limit
    return None


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
