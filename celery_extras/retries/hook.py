"""``retry_policy`` at run time: on a matching exception, retry after the policy's wait.

The wrapper replaces the task instance's ``run`` before the worker builds its
tracer. The wait comes from the policy bound to Redis-backed failure counts, so
every worker sees the same per-item memory; success forgets it. The retry goes
through Celery's own ``task.retry`` (publish the retry, then the old message is
acked), and a countdown may be a fraction of a second. A retry that waits longer
than ``extras_delay_max_hold`` is parked in the delay store instead of published
with an ETA (:mod:`celery_extras.retries.parking`), so no broker's visibility timeout
delivers it twice. Retries exhausted: the
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

from celery import Celery, Task
from celery.exceptions import Ignore, Reject, Retry

from ..bounds import clamp_wait, shown
from ..delay.parking import Parker
from ..settings import settings_of
from ..store.client import forget_after_fork, redis_client, store_key, store_url, store_user
from ..store.health import StoreUser
from .parking import ParkingProducer
from .policies import RetryPolicy
from .redis_failure_memory import redis_counts
from .spec import RetrySpec

__all__ = ["install_retry", "retry_memory"]

logger = logging.getLogger(__name__)

#: What an outage does to the failure memory, as its outage lines say it.
_NOT_FORGOTTEN = "failures are not forgotten until it answers (they expire)"
_OWN_RETRY_NUMBER = "retries wait the policy's wait for their retry number until it answers"
_EITHER = ("retries wait the policy's wait for their retry number, and failures are not "
           "forgotten (they expire), until it answers")  # fmt: skip
_bound: weakref.WeakKeyDictionary[Celery, dict[str, RetryPolicy]] = weakref.WeakKeyDictionary()
_parkers: weakref.WeakKeyDictionary[Celery, tuple[float, Parker]] = weakref.WeakKeyDictionary()
forget_after_fork(_bound, _parkers)  # they hold store clients


def retry_memory(app: Celery, task_name: str, policy: RetryPolicy) -> RetryPolicy:
    """*policy* bound to *task_name*'s failure counts in *app*'s store (shared by all workers).

    Tests and tools use it to read ``num_requeues(item)``; the worker uses it to decide.
    """
    ttl: float = settings_of(app)["retry_memory_ttl"]
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
                "celery-extras: retry_policy key of %s failed; using the task id", shown(task.name)
            )
    return str(task.request.id)


def _memory_store(app: Celery) -> StoreUser:
    """The failure memory's view of *app*'s store in this process (a pool process has its
    own): one line per outage, not one per task, and no call while it backs off."""
    return store_user(app, logger, "retry failure memory", _EITHER)


def _forget(task: Task, spec: RetrySpec, item: str) -> None:
    store = _memory_store(task.app)
    if not store.up():
        return
    try:
        _bound_policy(task.app, task.name, spec).forget(item)
    except Exception as exc:  # the store's trouble must not fail a task that succeeded
        store.failed(exc, _NOT_FORGOTTEN)
    else:
        store.answered()


class _RetriesSoFar:
    """Failure counts read from the request's ``retries`` (the store that keeps them is away),
    so that the wait still grows with each retry instead of repeating the first one."""

    def __init__(self, retries: int) -> None:
        self.retries = retries

    def incr(self, item: str) -> int:
        return self.retries + 1

    def get(self, item: str) -> int:
        return self.retries

    def forget(self, item: str) -> None:
        pass


def _countdown(task: Task, spec: RetrySpec, item: str) -> float:
    store = _memory_store(task.app)
    wait: float | None = None
    if store.up():
        try:
            wait = _bound_policy(task.app, task.name, spec).when(item)
        except Exception as exc:  # unreachable, wrong-type key, garbage count
            store.failed(exc, _OWN_RETRY_NUMBER)
        else:
            store.answered()
    if wait is None:
        counts = _RetriesSoFar(int(task.request.retries or 0))
        wait = spec.policy.bind(lambda path: counts).when(item)
    return clamp_wait(wait)


def _parker(app: Celery, countdown: float) -> Parker | None:
    """The process's :class:`Parker` when a retry waiting *countdown* s must be parked."""
    if store_url(app) is None:
        return None
    per_app = _parkers.get(app)
    if per_app is None:
        settings = settings_of(app)
        per_app = _parkers[app] = (
            float(settings["delay_max_hold"]),
            Parker(app, settings["delay_tombstone_ttl"]),
        )
    max_hold, parker = per_app
    return parker if countdown > max_hold else None


def _retry(task: Task, exc: BaseException, countdown: float, producer: Any = None
           ) -> BaseException:  # fmt: skip
    """Celery's ``task.retry`` on *producer* (``None``: one of the app's pool); parked in the
    delay store when it waits beyond the hold."""
    parker = _parker(task.app, countdown)
    if parker is None:
        retry: BaseException = task.retry(
            exc=exc, countdown=countdown, max_retries=sys.maxsize, producer=producer
        )
        return retry
    with task.app.producer_or_acquire(producer) as publisher:
        parking = ParkingProducer(publisher, parker, task.name, countdown)
        parked: BaseException = task.retry(
            exc=exc, countdown=countdown, max_retries=sys.maxsize, producer=parking
        )
        return parked


def _retry_anew(task: Task, exc: BaseException, countdown: float) -> BaseException:
    """:func:`_retry` once more, on a connection of its own: a pooled producer that a broker
    outage left unusable in kombu fails every publish (``AttributeError: 'NoneType' object
    has no attribute 'client'``, 30 s after the broker came back: chaos seed 699640), and its
    message, put back, would run a second time."""
    with task.app.connection_for_write() as connection:
        return _retry(task, exc, countdown, task.app.amqp.Producer(connection))


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
            if task.request.called_directly or task.request.is_eager:
                raise  # eager: Celery would retry at once, recursively (no wait to keep)
            item = _item(task, spec, args, kwargs)
            if spec.max_retries is not None and task.request.retries >= spec.max_retries:
                _forget(task, spec, item)
                raise
            countdown = _countdown(task, spec, item)
            try:
                raise _retry(task, exc, countdown) from exc
            except Reject:  # Celery's answer to a retry it could not publish
                try:
                    raise _retry_anew(task, exc, countdown) from exc
                except Reject as unpublished:
                    raise _keep(task, exc, unpublished.reason) from exc
        request = task.request
        if not request.called_directly and (spec.per_item or request.retries):
            _forget(task, spec, _item(task, spec, args, kwargs))
        return result

    task.run = run
