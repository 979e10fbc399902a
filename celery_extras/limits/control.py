"""``celery extras limit TASK RATE``: change a limit at run time, cluster-wide.

The new rate is written to the store (global buckets read it on every acquire;
workers started later load it) and broadcast to the running workers with the
``extras_limit`` control command (worker-scope buckets change at once). ``--key K``
changes it for one key of a per-key limit (one customer's plan); ``--limit N`` names
the N-th ``limit()`` (top first) of a task that has several.
``--reset`` removes it from the store and, with ``extras_limit_reset``, from the
running workers; ``--show`` lists what is stored and what each worker applies.
A task that no worker limits (and whose app declares no ``limit()``) is refused:
a stored rate would silently wait for it forever.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.worker.control import control_command, ok
from celery.worker.control import nok as not_ok

from ..admission.pipeline import PIPELINE_ATTR
from ..store.client import redis_client, store_key
from .gate import LimitGate
from .planner import LimitPlanner
from .rate import format_rate, parse_burst, parse_rate
from .redis_bucket import GlobalTokenBucket, Override, override_field
from .spec import limit_id

__all__ = [
    "extras_limit",
    "extras_limit_reset",
    "limited_tasks",
    "reset_limit",
    "set_limit",
    "show_limits",
]

logger = logging.getLogger(__name__)


def _planner(consumer: Any) -> LimitPlanner | None:
    """The limits of *consumer*'s admission pipeline, if celery-extras runs there."""
    pipeline = getattr(consumer, PIPELINE_ATTR, None)
    return None if pipeline is None else pipeline.gate(LimitGate.label).planner


def extras_limit(
    state: Any,
    task_name: Any = None,
    rate: Any = None,
    burst: Any = None,
    key: Any = None,
    limit: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Set the celery-extras limit of a task (one limit, one key of it) on this worker."""
    planner = _planner(state.consumer)
    if planner is None:
        return dict(not_ok("celery-extras policies are not installed on this worker"))
    try:
        return dict(ok(planner.set_limit(task_name, rate, burst, key, limit)))
    except ValueError as exc:
        return dict(not_ok(str(exc)))


control_command(
    args=[("task_name", str), ("rate", str), ("burst", int), ("key", str), ("limit", int)],
    signature="<task_name> <rate (e.g. 10/s | 100/m | 1000/h)> [burst] [key] [limit]",
)(extras_limit)


def extras_limit_reset(
    state: Any, task_name: Any = None, key: Any = None, limit: Any = None, **kwargs: Any
) -> dict[str, Any]:
    """Drop the run-time rate of a task (one limit, one key) on this worker."""
    planner = _planner(state.consumer)
    if planner is None:
        return dict(not_ok("celery-extras policies are not installed on this worker"))
    try:
        return dict(ok(planner.reset_limit(task_name, key, limit)))
    except ValueError as exc:
        return dict(not_ok(str(exc)))


control_command(
    args=[("task_name", str), ("key", str), ("limit", int)],
    signature="<task_name> [key] [limit]",
)(extras_limit_reset)


def limited_tasks(app: Celery, timeout: float = 1.0) -> dict[str, dict[str, Any]]:
    """Every limited task: ``{name: {"app": [describe() per limit] | None, "workers":
    {host: entry}}}``.

    From the workers' ``inspect stats`` (what each applies) and from *app*'s own
    task registry (the ``limit()`` it declares, so a limit can be set before any
    worker runs).
    """
    from ..admission.registry import policies_of

    found: dict[str, dict[str, Any]] = {}
    try:
        app.loader.import_default_modules()
    except Exception as exc:  # the project's modules may need what only workers have
        logger.debug("celery-extras: could not import the app's task modules: %r", exc)
    for name, task in sorted(app.tasks.items()):
        policies = policies_of(task)
        if policies is not None and policies.limits:
            found[name] = {"app": [spec.describe() for spec in policies.limits], "workers": {}}
    replies = app.control.inspect(timeout=timeout).stats() or {}
    for host, reply in sorted(replies.items()):
        info = reply.get("extras_policies") if isinstance(reply, dict) else None
        limits = info.get("limits") if isinstance(info, dict) else None
        if not isinstance(limits, dict):
            continue
        for name, entry in limits.items():
            found.setdefault(name, {"app": None, "workers": {}})["workers"][host] = entry
    return found


def show_limits(app: Celery, timeout: float = 1.0) -> dict[str, Any]:
    """``{"stored": {field: rate text}, "tasks": limited_tasks(...)}`` for ``--show``: a
    field is a limit's id, or ``[id, key]`` (see :func:`~.redis_bucket.override_field`)."""
    stored: dict[str, Any] = {}
    for name, raw in GlobalTokenBucket(redis_client(app), store_key(app)).overrides().items():
        try:
            override = Override.loads(raw)
        except ValueError as exc:
            stored[name] = f"unreadable: {exc}"
            continue
        burst = f" burst {override.burst}" if override.burst else ""
        stored[name] = (override.text or format_rate(override.rate)) + burst
    return {"stored": stored, "tasks": limited_tasks(app, timeout)}


def reset_limit(
    app: Celery, task_name: str, timeout: float = 1.0, key: str | None = None, limit: int = 1
) -> list[dict[str, Any]]:
    """Remove the stored rate of the *limit*-th ``limit()`` of *task_name* (for *key*) and
    drop it on the running workers; their replies."""
    field = override_field(limit_id(task_name, limit - 1), key or "")
    GlobalTokenBucket(redis_client(app), store_key(app)).set_override(field, None)
    arguments = {"task_name": task_name, "key": key, "limit": limit}
    replies: list[dict[str, Any]] = app.control.broadcast(
        "extras_limit_reset", arguments=arguments, reply=True, timeout=timeout
    )
    return replies


def set_limit(
    app: Celery,
    task_name: str,
    rate: str,
    burst: int | None = None,
    timeout: float = 1.0,
    key: str | None = None,
    limit: int = 1,
) -> list[dict[str, Any]]:
    """Store and broadcast a new rate for the *limit*-th ``limit()`` (top first) of
    *task_name*, for one *key* of it or all; returns the workers' replies.

    Raises :class:`ValueError` for a bad rate or burst before anything is changed.
    """
    per_second = parse_rate(rate)
    checked = None if burst is None else parse_burst(burst)
    text = rate.strip() if isinstance(rate, str) else format_rate(per_second)
    override = Override(per_second, checked, text)
    field = override_field(limit_id(task_name, limit - 1), key or "")
    GlobalTokenBucket(redis_client(app), store_key(app)).set_override(field, override)
    arguments: dict[str, Any] = {
        "task_name": task_name, "rate": rate, "burst": burst, "key": key, "limit": limit,
    }  # fmt: skip
    replies: list[dict[str, Any]] = app.control.broadcast(
        "extras_limit", arguments=arguments, reply=True, timeout=timeout
    )
    return replies
