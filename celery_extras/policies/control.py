"""``celery extras limit TASK RATE``: change a limit at run time, cluster-wide.

The new rate is written to the store (global buckets read it on every acquire;
workers started later load it) and broadcast to the running workers with the
``extras_limit`` control command (worker-scope buckets change at once).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.worker.control import control_command, ok
from celery.worker.control import nok as not_ok

from ..store import redis_client, store_key
from .enforce import ENFORCER_ATTR, Enforcer
from .global_bucket import GlobalBucket, Override
from .rate import format_rate, parse_rate

__all__ = ["extras_limit", "set_limit"]


def extras_limit(
    state: Any, task_name: str, rate: str, burst: int | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Set the celery-extras limit of a task on this worker."""
    enforcer: Enforcer | None = getattr(state.consumer, ENFORCER_ATTR, None)
    if enforcer is None:
        return dict(not_ok("celery-extras policies are not installed on this worker"))
    try:
        return dict(ok(enforcer.set_limit(task_name, rate, burst)))
    except ValueError as exc:
        return dict(not_ok(str(exc)))


control_command(
    args=[("task_name", str), ("rate", str), ("burst", int)],
    signature="<task_name> <rate (e.g. 10/s | 100/m | 1000/h)> [burst]",
)(extras_limit)


def set_limit(
    app: Celery, task_name: str, rate: str, burst: int | None = None, timeout: float = 1.0
) -> list[dict[str, Any]]:
    """Store and broadcast a new limit; returns the workers' replies.

    Raises :class:`ValueError` for a bad rate or burst before anything is changed.
    """
    per_second = parse_rate(rate)
    if burst is not None and burst < 1:
        raise ValueError(f"burst {burst!r}: expected an integer >= 1")
    override = Override(per_second, burst, rate if isinstance(rate, str) else format_rate(rate))
    GlobalBucket(redis_client(app), store_key(app)).set_override(task_name, override)
    arguments: dict[str, Any] = {"task_name": task_name, "rate": rate, "burst": burst}
    replies: list[dict[str, Any]] = app.control.broadcast(
        "extras_limit", arguments=arguments, reply=True, timeout=timeout
    )
    return replies
