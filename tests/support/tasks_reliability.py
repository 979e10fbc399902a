"""Tasks of the reliability suite: acks_late, limited, retried, and fragile ``key=`` input."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from celery_extras import ExponentialBackoff, limit, retry_policy

from .journal import Journal

__all__ = ["bad_key", "limited", "retried"]


def _note(task: Task, **fields: Any) -> None:
    Journal(task.app.main or "extras-test").note(task, **fields)


@limit("10/s", burst=2, scope="global")
@shared_task(bind=True, name="tests.reliability.limited", acks_late=True)
def limited(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag, outcome="done")
    return tag


@retry_policy(on=(ValueError,), policy=ExponentialBackoff(base=0.2, cap=1.0))
@shared_task(bind=True, name="tests.reliability.retried", acks_late=True)
def retried(self: Task, tag: Any = None) -> Any:
    """Fail once with ``ValueError``, then succeed."""
    if self.request.retries == 0:
        _note(self, tag=tag, outcome="failed")
        raise ValueError(f"first attempt of {tag}")
    _note(self, tag=tag, outcome="done")
    return tag


@limit("50/s", scope="worker", key=lambda args, kwargs: args[0]["customer"])
@shared_task(bind=True, name="tests.reliability.bad_key")
def bad_key(self: Task, payload: Any, tag: Any = None) -> Any:
    """Limited per ``payload["customer"]``: a payload without one breaks the ``key=`` callable."""
    _note(self, tag=tag, outcome="done")
    return tag
