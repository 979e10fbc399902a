"""``coalesce()``: one run per key at a time, cluster-wide, stacked above ``@app.task``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..admission.decorators import recording, refuses_bare
from ..admission.registry import TaskPolicies
from ..admission.sent import stamped_tasks
from ..admission.spec import KeyFunc
from .spec import CoalesceSpec

__all__ = ["coalesce"]

T = TypeVar("T")


@refuses_bare("@coalesce(key=lambda args, kwargs: args[0])")
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
        stamped_tasks.add(name)  # its producers stamp the send time
        return spec

    return recording("coalesce", build)
