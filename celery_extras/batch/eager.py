"""An eager group of batched calls (``task_always_eager``, ``group(...).apply()``) runs as
one batch, as a worker would run those calls.

Celery applies an eager group's members one by one, so nothing at a member's ``apply()``
knows the others. :func:`install_group_apply` wraps ``group.apply`` once: a group whose
members are all plain signatures of one batched task (no arguments passed on to them)
has its members' ids fixed and their calls noted (this thread's); the first member's
eager run then runs the task once with every call (:func:`batch_of`) and keeps the other
calls' items, which their own eager runs take (:func:`take`). Each member still ends
through its own ``apply()``: its result, callbacks and signals, as any eager call.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from celery.canvas import Signature, group

from .call import Call

__all__ = ["batch_of", "install_group_apply", "take"]

_local = threading.local()


def batch_of(call: Call) -> list[Call]:
    """The eager batch *call* opens: every call of the eager group it is a member of (its
    own :class:`Call` in its place), once; else *call* alone."""
    pending: list[Call] | None = getattr(_local, "pending", None)
    if not pending or call.id not in {c.id for c in pending}:
        return [call]
    _local.pending = None
    return [call if c.id == call.id else c for c in pending]


def keep(calls: Sequence[Call], results: Sequence[Any], own: str) -> None:
    """Keep the items of *calls* but call *own*'s, for their own eager runs to take."""
    items: dict[str, Any] | None = getattr(_local, "items", None)
    if items is not None:
        items.update((c.id, r) for c, r in zip(calls, results, strict=True) if c.id != own)


def take(call_id: str) -> tuple[bool, Any]:
    """``(True, item)`` when call *call_id*'s item was made by its group's batch."""
    items: dict[str, Any] | None = getattr(_local, "items", None)
    if items and call_id in items:
        return True, items.pop(call_id)
    return False, None


def _members(members: Sequence[Any], args: Any, kwargs: Any) -> list[Call] | None:
    """The calls of a group of *members* when it runs as one batch, their ids fixed."""
    if args or kwargs or len(members) < 2 or getattr(_local, "items", None) is not None:
        return None
    if not all(type(m) is Signature for m in members) or len({m.task for m in members}) != 1:
        return None
    try:
        batched = getattr(members[0].type, "_extras_batch_retry", False)
    except Exception:  # a task this app does not know: Celery's apply says so
        return None
    if not batched:
        return None
    return [Call(str(m.freeze().id), tuple(m.args), dict(m.kwargs), {"id": m.id, "task": m.task},
                 name=m.task) for m in members]  # fmt: skip


def install_group_apply() -> None:
    """Wrap ``group.apply`` (once per process): see the module's docstring."""
    if getattr(group.apply, "_extras_batch", False):
        return
    original: Callable[..., Any] = group.apply

    @functools.wraps(original)
    def apply(self: group, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        calls = _members(list(self.tasks), args, kwargs)
        if calls is None:
            return original(self, args, kwargs, **options)
        _local.pending, _local.items = calls, {}
        try:
            return original(self, args, kwargs, **options)
        finally:
            _local.pending = _local.items = None

    apply._extras_batch = True  # type: ignore[attr-defined]
    group.apply = apply
