"""Eager calls (``task_always_eager``, ``Task.apply``) never reach a worker, so the policies
that act there do not apply: the task runs once, in the caller. Said once per task, as a
warning, rather than left for a test to discover."""

from __future__ import annotations

import warnings
from typing import Any

from .registry import policies_of

__all__ = ["EagerPolicyWarning", "warn_eager"]

_warned: set[str] = set()


class EagerPolicyWarning(UserWarning):
    """A task with celery-extras policies ran eagerly, where they do not apply."""


def warn_eager(task: Any = None, **_: Any) -> None:
    """``task_prerun`` receiver: warn the first time a task with policies runs eagerly."""
    if task is None or not getattr(task.request, "is_eager", False) or task.name in _warned:
        return
    policies = policies_of(task)
    if policies is None:
        return
    # a batched task runs eagerly as a batch of the one call (celery_extras.batch.runner)
    declared = [policy.decorator for policy in policies.declared() if policy.name != "batch"]
    if not declared:
        return
    _warned.add(task.name)
    warnings.warn(
        f"{task.name} ran eagerly (task_always_eager or apply()): its {', '.join(declared)} "
        "do not apply there (no limit, cap or coalescing; no retry: the first failure is the "
        "task's); test them with celery-extras' pytest fixtures extras_worker and "
        "extras_clock",
        EagerPolicyWarning,
        stacklevel=2,
    )
