"""Tasks of the policies tests: limited and retried tasks that journal each run."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task
from celery.worker.request import Request

from celery_extras import ExponentialBackoff, limit, retry_memory, retry_policy

from .journal import Journal

__all__ = ["BACKOFF", "AckNotingRequest", "exhaust", "flaky", "global20", "global100",
           "global5000", "kill_early", "kill_late", "per_key", "store_down", "tunable",
           "worker10"]  # fmt: skip

#: The backoff of ``flaky``: 0.3, 0.6, 1.2, 1.5, 1.5 ... seconds.
BACKOFF = ExponentialBackoff(base=0.3, cap=1.5)


def _note(task: Task, **fields: Any) -> None:
    Journal(task.app.main or "extras-test").note(task, **fields)


@limit("20/s", burst=2, scope="global")
@shared_task(bind=True, name="tests.policies.global20")
def global20(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("100/s", scope="global")
@shared_task(bind=True, name="tests.policies.global100")
def global100(self: Task, tag: Any = None) -> Any:
    """A slot every 10 ms, two within a booked slot's late tolerance; one worker's drain
    is faster: the limit binds."""
    _note(self, tag=tag)
    return tag


@limit("5000/s", scope="global")
@shared_task(bind=True, name="tests.policies.global5000")
def global5000(self: Task, tag: Any = None) -> Any:
    """Faster than one worker drains: the bucket stands idle between its calls."""
    _note(self, tag=tag)
    return tag


@limit("10/s", scope="worker")
@shared_task(bind=True, name="tests.policies.worker10")
def worker10(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("5/s", scope="global", key=lambda args, kwargs: args[0])
@shared_task(bind=True, name="tests.policies.per_key")
def per_key(self: Task, customer: str, tag: Any = None) -> Any:
    _note(self, tag=tag, customer=customer)
    return tag


class AckNotingRequest(Request):
    """Journals (set ``accepted``) the id of a request Celery's pool accepted, before
    Celery acks it: an early-ack task lost in a SIGKILL after that is Celery's own
    at-most-once, not a task lost while celery-extras held it."""

    def on_accepted(self, pid: Any, time_accepted: Any) -> Any:
        Journal(self.task.app.main or "extras-test").mark("accepted", self.id)
        return super().on_accepted(pid, time_accepted)


@limit("3/s", scope="global")
@shared_task(bind=True, name="tests.policies.kill_early", Request=AckNotingRequest)
def kill_early(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("3/s", scope="global")
@shared_task(bind=True, name="tests.policies.kill_late", acks_late=True)
def kill_late(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("2/s", scope="global")
@shared_task(bind=True, name="tests.policies.store_down")
def store_down(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@limit("1/s", scope="worker")
@shared_task(bind=True, name="tests.policies.tunable")
def tunable(self: Task, tag: Any = None) -> Any:
    _note(self, tag=tag)
    return tag


@retry_policy(on=(ValueError,), policy=BACKOFF, per_item=True, key=lambda args, kwargs: args[0])
@shared_task(bind=True, name="tests.policies.flaky")
def flaky(self: Task, item: str, failures: int, tag: Any = None) -> Any:
    """Fail with ``ValueError`` on the first *failures* attempts, then succeed."""
    requeues = retry_memory(self.app, self.name, BACKOFF).num_requeues(item)
    _note(self, tag=tag, item=item, requeues=requeues)
    if self.request.retries < failures:
        raise ValueError(f"{item} attempt {self.request.retries}")
    return self.request.retries


@retry_policy(on=KeyError, policy=ExponentialBackoff(base=0.05, cap=0.1), max_retries=2)
@shared_task(bind=True, name="tests.policies.exhaust")
def exhaust(self: Task, tag: Any = None) -> None:
    """Always raise ``KeyError``: fails for good after 2 retries."""
    _note(self, tag=tag)
    raise KeyError(f"missing {tag}")
