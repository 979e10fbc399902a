"""``celery_extras.invalidate(task, *args, **kwargs)``: forget the result a ``memoize()``
task keeps for the key those arguments make (its next message runs); and what
``celery -A proj extras memoize`` shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery

from ..admission.registry import POLICY_ATTR, target_of
from ..store.client import redis_client, store_key, store_url
from .redis_memo import RedisMemo
from .spec import MemoizeSpec

__all__ = ["forget", "invalidate", "kept", "memoized_spec"]


def memoized_spec(app: Celery, name: str) -> MemoizeSpec:
    """The ``memoize()`` spec of task *name* of *app*; :class:`ValueError` when it has none."""
    task = app.tasks.get(name)
    spec = None
    if task is not None:
        fun, _ = target_of(task)
        policies = getattr(fun, POLICY_ATTR, None)
        spec = policies.specs.get("memoize") if policies is not None else None
    if not isinstance(spec, MemoizeSpec):
        raise ValueError(f"{name}: not a memoize() task of this app")
    return spec


def _memo(app: Celery) -> RedisMemo:
    if store_url(app) is None:
        raise RuntimeError("memoize(): no store (extras_redis_url, or a Redis broker): "
                           "each worker keeps its own results")  # fmt: skip
    return RedisMemo(redis_client(app, background=True), store_key(app))


def forget(app: Celery, name: str, args: Sequence[Any] = (),
           kwargs: Mapping[str, Any] | None = None) -> bool:  # fmt: skip
    """Forget the result task *name* keeps for *args*, *kwargs*: whether it kept one."""
    spec = memoized_spec(app, name)
    key = str(spec.key(list(args), dict(kwargs or {})))
    return _memo(app).invalidate((name, key))


def invalidate(task: Any, *args: Any, **kwargs: Any) -> bool:
    """Forget the result memoized *task* keeps for the key ``key(args, kwargs)`` makes (by
    default its arguments): its next message with them runs. Whether a result was kept."""
    _, name = target_of(task)
    return forget(task.app, name, args, kwargs)


def kept(app: Celery, name: str) -> list[str]:
    """The keys task *name* keeps a result for, most recently used first."""
    memoized_spec(app, name)
    return list(_memo(app).listing(name))
