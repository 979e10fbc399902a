"""Tasks of the store-stall tests: one without any policy, and one under each policy whose
gate asks the store on the worker's loop (a global limit, a global cap, coalescing,
debouncing, one global slot held long); every
run is journalled, so "every gated task sent during the stall runs once" is counted."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from celery_extras import coalesce, concurrency, debounce, limit

from .journal import Journal

__all__ = ["capped", "coalesced", "debounced", "free", "limited", "one_slot"]


def _done(task: Task, tag: Any) -> Any:
    Journal(task.app.main or "extras-test").note(task, tag=tag)
    return tag


@shared_task(bind=True, name="tests.stall.free")
def free(self: Task, tag: Any = None) -> Any:
    return _done(self, tag)


@limit("1000/s", scope="global")
@shared_task(bind=True, name="tests.stall.limited")
def limited(self: Task, tag: Any = None) -> Any:
    return _done(self, tag)


@concurrency(50, scope="global")
@shared_task(bind=True, name="tests.stall.capped")
def capped(self: Task, tag: Any = None) -> Any:
    return _done(self, tag)


@coalesce(key=lambda args, kwargs: str(args[0]))
@shared_task(bind=True, name="tests.stall.coalesced")
def coalesced(self: Task, tag: Any = None) -> Any:
    return _done(self, tag)


@debounce(0.2, key=lambda args, kwargs: str(args[0]))
@shared_task(bind=True, name="tests.stall.debounced")
def debounced(self: Task, tag: Any = None) -> Any:
    return _done(self, tag)


@concurrency(1, scope="global", lease=300)  # a slot taken and lost holds its key 300 s
@shared_task(bind=True, name="tests.stall.one_slot")
def one_slot(self: Task, tag: Any = None) -> Any:
    return _done(self, tag)
