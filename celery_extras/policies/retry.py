"""``retry_policy`` at run time: on a matching exception, retry after the policy's wait.

The wrapper replaces the task instance's ``run`` before the worker builds its
tracer. The wait comes from the policy bound to Redis-backed failure counts, so
every worker sees the same per-item memory; success forgets it. The retry goes
through Celery's own ``task.retry`` (publish the retry, then the old message is
acked), and a countdown may be a fraction of a second. Retries exhausted: the
task fails with the original exception.

Where Celery drops a task whose retry cannot be published (``Reject`` without
requeue, e.g. during a broker outage), the message is kept instead: with
``acks_late`` it goes back to the queue; acked on receipt, the task fails with
its exception, visibly, rather than vanishing.
"""

from __future__ import annotations

import functools
import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, Task
from celery.exceptions import Ignore, Reject, Retry

from ..store import StoreUnavailable, redis_client, store_key
from .counts import memory_counts
from .failure_store import redis_counts
from .retry_limiters import RetryPolicy
from .spec import RetrySpec

__all__ = ["install_retry", "retry_memory"]

logger = logging.getLogger(__name__)

_STORE_ERRORS = (redis.RedisError, StoreUnavailable, OSError)
_bound: weakref.WeakKeyDictionary[Celery, dict[str, RetryPolicy]] = weakref.WeakKeyDictionary()
_DEFAULT_TTL = 86400.0


def retry_memory(app: Celery, task_name: str, policy: RetryPolicy) -> RetryPolicy:
    """*policy* bound to *task_name*'s failure counts in *app*'s store (shared by all workers).

    Tests and tools use it to read ``num_requeues(item)``; the worker uses it to decide.
    """
    ttl = float(app.conf.get("extras_retry_memory_ttl") or _DEFAULT_TTL)
    counts = redis_counts(redis_client(app), store_key(app, "fail", task_name), ttl)
    return policy.bind(counts)


def _bound_policy(app: Celery, task_name: str, spec: RetrySpec) -> RetryPolicy:
    per_app = _bound.setdefault(app, {})
    policy = per_app.get(task_name)
    if policy is None:
        policy = per_app[task_name] = retry_memory(app, task_name, spec.policy)
    return policy


def _item(task: Task, spec: RetrySpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    if spec.per_item and spec.key is not None:
        try:
            return str(spec.key(args, kwargs))
        except Exception:
            logger.exception(
                "celery-extras: retry_policy key of %s failed; using the task id", task.name
            )
    return str(task.request.id)


def _forget(task: Task, spec: RetrySpec, item: str) -> None:
    try:
        _bound_policy(task.app, task.name, spec).forget(item)
    except _STORE_ERRORS as exc:
        logger.warning(
            "celery-extras: could not forget failures of %s[%s]: %r", task.name, item, exc
        )


def _countdown(task: Task, spec: RetrySpec, item: str) -> float:
    try:
        return _bound_policy(task.app, task.name, spec).when(item)
    except _STORE_ERRORS as exc:
        logger.warning(
            "celery-extras: failure memory of %s unavailable (%r); retrying %s after the "
            "policy's first wait",
            task.name, exc, item,
        )  # fmt: skip
        return spec.policy.bind(memory_counts).when(item)


def _keep(task: Task, exc: BaseException, error: object) -> BaseException:
    """What to raise instead of Celery's ``Reject(requeue=False)`` when the retry of *task*
    could not be published: the message goes back to the queue, or the task fails."""
    if task.acks_late:
        logger.warning(
            "celery-extras: the retry of %s[%s] could not be published (%r); its message goes "
            "back to the queue",
            task.name, task.request.id, error,
        )  # fmt: skip
        requeue: BaseException = Reject(error, requeue=True)
        return requeue
    logger.error(
        "celery-extras: the retry of %s[%s] could not be published (%r) and its message was "
        "acknowledged on receipt (acks_late is off): the task fails with %r",
        task.name, task.request.id, error, exc,
    )  # fmt: skip
    return exc


def install_retry(task: Task, spec: RetrySpec) -> None:
    """Wrap *task*'s ``run`` so exceptions in ``spec.on`` are retried per ``spec.policy``."""
    if task.__dict__.get("_extras_retry") is spec:
        return
    original: Callable[..., Any] = task.__dict__.get("_extras_run") or task.run
    task._extras_run = original
    task._extras_retry = spec

    @functools.wraps(original)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            result = original(*args, **kwargs)
        except (Retry, Ignore, Reject):
            raise
        except spec.on as exc:
            if task.request.called_directly:
                raise
            item = _item(task, spec, args, kwargs)
            if spec.max_retries is not None and task.request.retries >= spec.max_retries:
                _forget(task, spec, item)
                raise
            countdown = _countdown(task, spec, item)
            try:
                raise task.retry(exc=exc, countdown=countdown, max_retries=sys.maxsize) from exc
            except Reject as unpublished:  # Celery's answer to a retry it could not publish
                raise _keep(task, exc, unpublished.reason) from exc
        request = task.request
        if not request.called_directly and (spec.per_item or request.retries):
            _forget(task, spec, _item(task, spec, args, kwargs))
        return result

    task.run = run
