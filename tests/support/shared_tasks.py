"""Celery's shared tasks (``@shared_task``, and ``@app.task`` by default) are attached to
every app made afterwards in the process: a test that shares one leaks it into the next
tests' apps (it showed in the CLI's task lists of the docs tests, by test order)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import _state

__all__ = ["shared_tasks_isolated"]


@contextmanager
def shared_tasks_isolated(celerys_only: bool = False) -> Iterator[set[Any]]:
    """Within the block, tasks it shares reach the apps made in it; afterwards the tasks
    shared with new apps are exactly those from before. *celerys_only*: within the block,
    only Celery's built-in tasks are (not what other tests of the process shared). Yields
    what is shared as the block starts."""
    finalizers = _state._on_app_finalizers
    before = set(finalizers)
    if celerys_only:
        finalizers.intersection_update(
            {f for f in before if getattr(f, "__module__", "") == "celery.app.builtins"}
        )
    try:
        yield set(finalizers)
    finally:
        finalizers.clear()
        finalizers.update(before)
