"""``limit``, ``concurrency``, ``coalesce``, ``batch`` and ``retry_policy``: stacked above
``@app.task`` / ``@shared_task``.

Each checks its arguments at once (errors name the task and the argument),
records the policy on the task's function (see :mod:`.registry`) and applies it
to the tasks already made from that function in every app celery-extras is
installed on; apps finalized later apply it as they finalize.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Celery, Task

from ..batch.runner import install_batch
from ..batch.spec import BatchSpec
from ..coalesce.sent import coalesced_tasks
from ..coalesce.spec import CoalesceSpec
from ..concurrency.spec import ConcurrencySpec
from ..limits.spec import CostFunc, LimitSpec
from ..retries.hook import install_retry
from ..retries.policies import RetryPolicy
from ..retries.spec import RetrySpec
from .consumer import admitted_strategy
from .registry import TaskPolicies, policies_of, record, target_of, tasks_made_from
from .spec import KeyFunc

__all__ = [
    "apply_policies",
    "batch",
    "coalesce",
    "concurrency",
    "limit",
    "retry_policy",
    "track_app",
]

T = TypeVar("T")

_apps: weakref.WeakSet[Celery] = weakref.WeakSet()
#: The strategy of a task with ``limit()`` or ``concurrency()`` (by name, as Celery takes it).
_STRATEGY = f"{admitted_strategy.__module__}:{admitted_strategy.__name__}"


def limit(
    rate: str | float,
    *,
    burst: int | None = None,
    scope: str = "global",
    key: KeyFunc | None = None,
    cost: int | CostFunc = 1,
    shadow: bool = False,
) -> Callable[[T], T]:
    """Limit a task to *rate* (``"10/s"``, ``"100/m"``, ``"1000/h"``), *burst* at once.

    ``scope="global"``: one bucket shared by every worker (on Redis);
    ``scope="worker"``: one per worker. ``key(args, kwargs)`` gives each key its own
    bucket. Each call takes *cost* tokens (an int, or ``cost(args, kwargs)``; 0 takes
    none). Stacked limits all hold: a task runs when every one admits it. A *shadow*
    limit is evaluated and counted (``shadow_limited``) but never delays. A task that
    must wait never holds a pool slot, is never run early and never lost.
    """

    def build(name: str, declared: TaskPolicies) -> tuple[LimitSpec, ...]:
        spec = LimitSpec.build(name, rate, burst, scope, key, cost, shadow)
        return (spec, *declared.limits)  # decorators apply bottom-up: this one is on top

    return _recording("limits", build)


def concurrency(
    n: int,
    *,
    key: KeyFunc | None = None,
    scope: str = "global",
    lease: float = 30.0,
) -> Callable[[T], T]:
    """Run at most *n* tasks of this name at once (per ``key(args, kwargs)`` if given).

    ``scope="global"``: slots shared by every worker (on Redis), each leased for *lease*
    seconds and renewed while its task runs, so a dead worker's slot comes back;
    ``scope="worker"``: slots per worker. A task that must wait never holds a pool slot,
    never runs over the cap and is never lost.
    """

    return _recording(
        "concurrency", lambda name, _: ConcurrencySpec.build(name, n, key, scope, lease)
    )


def coalesce(*, key: KeyFunc, keep: str = "first", lease: float = 30.0) -> Callable[[T], T]:
    """Run at most one task of this name per ``key(args, kwargs)`` at once, cluster-wide,
    and only as often as needed (client-go's workqueue).

    A run covers every message of its key sent before it started: those are acked
    and resolve with its result. A message sent while its key runs makes one waiting
    run, started when the running one ends; *keep* (``"first"`` or ``"last"``) says
    whose arguments it takes. Holds are leased for *lease* seconds and renewed while
    the run goes on, so a dead worker's key frees itself.
    """

    def build(name: str, _: TaskPolicies) -> CoalesceSpec:
        spec = CoalesceSpec.build(name, key, keep, lease)
        coalesced_tasks.add(name)  # its producers stamp the send time
        return spec

    return _recording("coalesce", build)


def batch(size: int, *, wait: float, key: KeyFunc | None = None) -> Callable[[T], T]:
    """Run the task once for many messages: it is called with a list of
    :class:`~celery_extras.Call` (``id``, ``args``, ``kwargs``, ``headers``), at most *size*
    of them, once it has *size* calls or *wait* seconds after its first, and returns one
    result per call, in their order (or ``None``). ``key(args, kwargs)`` keeps a batch per
    key. Each call stays its own message: acked only after its batch ran, with its own
    result, callbacks and chord part; an exception or a retry applies to every call.
    """

    return _recording("batch", lambda name, _: BatchSpec.build(name, size, wait, key))


def retry_policy(
    *,
    on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    policy: RetryPolicy,
    max_retries: int | None = None,
    per_item: bool = False,
    key: KeyFunc | None = None,
) -> Callable[[T], T]:
    """Retry the task on *on* after ``policy.when(item)`` seconds, *max_retries* times at most.

    The item is the task id, or with ``per_item=True`` ``key(args, kwargs)``; its
    failures are counted in the store (seen by every worker) and forgotten on
    success. Out of retries, the task fails with the original exception.
    """

    return _recording(
        "retry", lambda name, _: RetrySpec.build(name, on, policy, max_retries, per_item, key)
    )


def _recording(policy: str, build: Callable[[str, TaskPolicies], Any]) -> Callable[[T], T]:
    """A decorator recording ``build(task name, policies declared so far)`` as the task's
    *policy* and applying it in every app already finalized (checked now: errors name the
    task and the argument)."""

    def decorate(task: T) -> T:
        fun, name = target_of(task)
        declared = record(fun)
        setattr(declared, policy, build(name, declared))
        _apply_everywhere(fun)
        return task

    return decorate


def apply_to_task(task: Task) -> None:
    """Give *task* the strategy and ``run`` wrapper its recorded policies need (idempotent)."""
    policies = policies_of(task)
    if policies is None:
        return
    if policies.gated() and task.__dict__.get("Strategy") != _STRATEGY:
        task._extras_strategy = task.Strategy
        task.Strategy = _STRATEGY
    if policies.retry is not None:
        install_retry(task, policies.retry)
    if policies.batch is not None:
        install_batch(task)


def apply_policies(sender: Celery, **kwargs: Any) -> None:
    """Apply recorded policies to every task of a finalized app (``on_after_finalize``)."""
    for task in list(sender.tasks.values()):  # finalized: no second finalize
        apply_to_task(task)


def track_app(app: Celery) -> None:
    """Apply policies in *app*, now if it is finalized and on every later decoration."""
    _apps.add(app)
    if app.finalized:
        apply_policies(app)
    else:
        app.on_after_finalize.connect(apply_policies, sender=app, weak=False)


def _apply_everywhere(fun: Callable[..., Any]) -> None:
    for app in list(_apps):
        if app.finalized:
            for task in tasks_made_from(app, fun):
                apply_to_task(task)
