"""Policies on an app celery-extras is not installed on: loud, never silently ignored.

A policy's decorator records it on the task's function whatever the app; only an app given
``celery_extras.install(app)`` enforces it. Without that call a worker would run the task
with no limit, no cap, no coalescing: a ``celery worker`` of such an app refuses to start,
naming the tasks and the call, and a client sending such a task from it warns once per task
name. An app that runs plain Celery on purpose beside tasks that have policies (a side by
side benchmark's) says so with ``extras_plain = True`` in its configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Celery, bootsteps
from celery.exceptions import ImproperlyConfigured
from celery.signals import worker_init

from ..compat import on_every_app_finalize
from ..settings import PREFIX, declared_settings
from .registry import policies_of

__all__ = ["PLAIN", "RefuseStart", "connect", "unenforced"]

#: The configuration key of an app that runs plain Celery on purpose: its tasks' policies
#: are left unenforced without a word (``app.conf.extras_plain = True``).
PLAIN = PREFIX + "plain"

logger = logging.getLogger(__name__)

#: Task names a send has warned of, once each in the process.
_warned: set[str] = set()


def _enforced(app: Celery) -> bool:
    """Whether *app* enforces policies (installed), or leaves them out on purpose."""
    if declared_settings(app):
        return True
    namespace = (app.namespace or "").rstrip("_")
    keys = (PLAIN, f"{namespace}_{PLAIN}".upper()) if namespace else (PLAIN,)
    return any(app.conf.get(key) is True for key in keys)


def _has_policy(task: Any) -> bool:
    policies = policies_of(task)
    return policies is not None and any(s not in (None, ()) for s in policies.specs.values())


def unenforced(app: Celery) -> list[str]:
    """The names of *app*'s tasks that declare a policy *app* does not enforce (sorted)."""
    if _enforced(app):
        return []
    return sorted(name for name, task in app.tasks.items() if _has_policy(task))


def _not_installed(app: Celery, names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"celery-extras is not installed on app {app.main!r}, yet its task(s) {shown} declare "
        f"policies (limit(), concurrency(), ...) that would not be enforced: call "
        f"celery_extras.install(app) where the app is made (or set {PLAIN} = True to run "
        f"them as plain Celery tasks on purpose)"
    )


class RefuseStart(bootsteps.Step):
    """Worker step that fails the start of a worker whose app has tasks with policies and no
    ``install(app)`` (a receiver's exception would only be logged by Celery's dispatch)."""

    label = "celery-extras-not-installed"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        names = unenforced(parent.app)
        if names:
            raise ImproperlyConfigured(_not_installed(parent.app, names))


def _refuse_worker(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver: a ``celery worker`` (not an in-process test worker, whose
    app may hold every shared task of the test process) of an app with unenforced policies
    gets :class:`RefuseStart`, run before any of its steps starts anything."""
    from celery.apps.worker import Worker

    if isinstance(sender, Worker) and unenforced(sender.app):
        sender.app.steps["worker"].add(RefuseStart)


def _watch_sends(app: Celery) -> None:
    """Called with every app as it finalizes: one not installed warns, once per task name,
    when it sends a task that declares a policy (``delay``, ``apply_async`` and
    ``send_task`` all go through ``app.send_task``)."""
    if declared_settings(app) or "send_task" in vars(app):
        return
    send: Callable[..., Any] = app.send_task
    checked: set[str] = set()

    def send_task(name: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(name, str) and name not in checked:
            checked.add(name)
            task = app.tasks.get(name)
            if (
                task is not None
                and name not in _warned
                and not _enforced(app)
                and _has_policy(task)
            ):
                _warned.add(name)
                logger.warning("celery-extras: sending %s: %s", name, _not_installed(app, [name]))
        return send(name, *args, **kwargs)

    app.send_task = send_task


def connect() -> None:
    """Connect the checks (once; the decorators' module does at import)."""
    worker_init.connect(_refuse_worker, weak=False, dispatch_uid="celery_extras.uninstalled")
    on_every_app_finalize(_watch_sends)
