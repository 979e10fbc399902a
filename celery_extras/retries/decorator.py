"""``retry_policy()``: client-go retry limiters on a task, stacked above ``@app.task``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..admission.decorators import recording, refuses_bare
from ..admission.spec import KeyFunc
from .policies import RetryPolicy
from .spec import RetrySpec

__all__ = ["retry_policy"]

T = TypeVar("T")


@refuses_bare("@retry_policy(policy=ExponentialBackoff(base=1, cap=60))")
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

    return recording(
        "retry", lambda name, _: RetrySpec.build(name, on, policy, max_retries, per_item, key)
    )
