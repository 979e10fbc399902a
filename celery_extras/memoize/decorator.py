"""``memoize()``: a key's result reused for ``ttl`` seconds, cluster-wide, stacked above
``@app.task``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..admission.decorators import recording, refuses_bare
from ..admission.registry import TaskPolicies
from ..admission.spec import KeyFunc
from .spec import MemoizeSpec

__all__ = ["memoize"]

T = TypeVar("T")


@refuses_bare("@memoize(60.0)")
def memoize(ttl: float, *, key: KeyFunc | None = None, max_keys: int = 10_000,
            lease: float = 30.0) -> Callable[[T], T]:  # fmt: skip
    """Reuse a task's result for *ttl* seconds per ``key(args, kwargs)`` (by default its
    arguments, canonically encoded), cluster-wide: the first seed's LRU ``memoize``.

    A message whose key has a result younger than *ttl* does not run: it ends with that
    result (its callbacks, chain and chord part run, its AsyncResult resolves). Messages of
    a key whose run is in flight join it: one run, every caller its result. A failure is not
    kept: the next message runs. At most *max_keys* keys are kept per task, the least
    recently used going first. :func:`celery_extras.invalidate` forgets a key. Needs a
    result backend (results are read from it). A run's hold is leased for *lease* seconds
    and renewed while it runs, so a dead worker's key frees itself.
    """

    def build(name: str, _: TaskPolicies) -> MemoizeSpec:
        return MemoizeSpec.build(name, ttl, key, max_keys, lease)

    return recording("memoize", build)
