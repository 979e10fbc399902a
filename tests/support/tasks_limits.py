"""Tasks of the several-limits tests: stacked, cost-weighted and shadow limits that journal
each run (with the cost it took)."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from celery_extras import limit

from .journal import Journal

__all__ = ["costly", "double", "mixed", "per_key", "refusing", "shadowed", "stacked",
           "unshadowed"]  # fmt: skip


def _note(task: Task, **fields: Any) -> None:
    Journal(task.app.main or "extras-test").note(task, **fields)


@limit("100/s", scope="global")
@limit("5/s", scope="global")
@shared_task(bind=True, name="tests.limits.stacked")
def stacked(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("10/s", scope="global")
@limit("2/s", scope="worker")
@shared_task(bind=True, name="tests.limits.mixed")
def mixed(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("20/s", burst=2, cost=2)
@shared_task(bind=True, name="tests.limits.double")
def double(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("20/s", burst=5, cost=lambda args, kwargs: args[0])
@shared_task(bind=True, name="tests.limits.costly")
def costly(self: Task, cost: int, tag: Any = None) -> Any:
    _note(self, tag=tag, cost=cost)
    return tag


@limit("5/s", shadow=True)
@shared_task(bind=True, name="tests.limits.shadowed")
def shadowed(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("5/s")
@shared_task(bind=True, name="tests.limits.unshadowed")
def unshadowed(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("2/s", key=lambda args, kwargs: args[0])
@shared_task(bind=True, name="tests.limits.per_key")
def per_key(self: Task, customer: str, tag: Any = None) -> Any:
    _note(self, tag=tag, customer=customer)
    return tag


@limit("10/s", burst=2, cost=lambda args, kwargs: args[0])
@shared_task(bind=True, name="tests.limits.refusing")
def refusing(self: Task, cost: Any, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag
