"""Tasks of the reliability suite: acks_late, limited, retried, and fragile ``key=`` input."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task

from celery_extras import ExponentialBackoff, limit, retry_policy

from .journal import Journal

__all__ = [
    "bad_key",
    "herd",
    "limited",
    "retried",
    "retried_in_outage",
    "retried_in_outage_early_ack",
    "retried_per_item",
    "weighted",
]


def _journal(task: Task) -> Journal:
    return Journal(task.app.main or "extras-test")


def _note(task: Task, **fields: Any) -> None:
    _journal(task).note(task, **fields)


_journals: dict[str, Journal] = {}


@shared_task(bind=True, name="tests.reliability.herd", acks_late=True)
def herd(self: Task, tag: Any = None) -> Any:
    """A member of a herd of ETA tasks: journalled on one connection per pool process (a
    connection per task would make the journal, not the worker, the bottleneck)."""
    ns = self.app.main or "extras-test"
    journal = _journals.get(ns) or _journals.setdefault(ns, Journal(ns))
    journal.note(self, tag=tag, outcome="done")
    return tag


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


@retry_policy(
    on=(ValueError,), policy=ExponentialBackoff(base=0.2, cap=1.0), per_item=True,
    key=lambda args, kwargs: args[0],
)  # fmt: skip
@shared_task(bind=True, name="tests.reliability.retried_per_item", acks_late=True)
def retried_per_item(self: Task, item: str, failures: int) -> Any:
    """Fail with ``ValueError`` on the first *failures* attempts (failure memory per item, in
    the store), then succeed."""
    if self.request.retries < failures:
        _note(self, tag=item, outcome="failed")
        raise ValueError(f"attempt {self.request.retries} of {item}")
    _note(self, tag=item, outcome="done")
    return item


@shared_task(bind=True, name="tests.reliability.weighted", acks_late=True)
def weighted(self: Task, tag: Any = None) -> Any:
    """20 ms of work, journalled when done; sent to a weighted queue of its own."""
    time.sleep(0.02)
    _note(self, tag=tag, outcome="done")
    return tag


def _fail_first_attempt_in_outage(task: Task, tag: Any) -> Any:
    """The first attempt waits for the test's ``outage`` flag (raised once the broker is
    down), then fails, so its retry must be published while the broker is away."""
    if task.request.retries == 0:
        _note(task, tag=tag, outcome="failed")
        _journal(task).wait_for_flag("outage")
        raise ValueError(f"first attempt of {tag}")
    _note(task, tag=tag, outcome="done")
    return tag


@retry_policy(on=(ValueError,), policy=ExponentialBackoff(base=0.2, cap=1.0))
@shared_task(bind=True, name="tests.reliability.retried_in_outage", acks_late=True)
def retried_in_outage(self: Task, tag: Any = None) -> Any:
    return _fail_first_attempt_in_outage(self, tag)


@retry_policy(on=(ValueError,), policy=ExponentialBackoff(base=0.2, cap=1.0))
@shared_task(bind=True, name="tests.reliability.retried_in_outage_early_ack", acks_late=False)
def retried_in_outage_early_ack(self: Task, tag: Any = None) -> Any:
    return _fail_first_attempt_in_outage(self, tag)


@limit("50/s", scope="worker", key=lambda args, kwargs: args[0]["customer"])
@shared_task(bind=True, name="tests.reliability.bad_key")
def bad_key(self: Task, payload: Any, tag: Any = None) -> Any:
    """Limited per ``payload["customer"]``: a payload without one breaks the ``key=`` callable."""
    _note(self, tag=tag, outcome="done")
    return tag
