"""``limit()``: a token bucket on a task, stacked above ``@app.task`` / ``@shared_task``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..admission.decorators import recording, refuses_bare
from ..admission.registry import TaskPolicies
from ..admission.spec import KeyFunc
from .spec import CostFunc, LimitSpec

__all__ = ["limit"]

T = TypeVar("T")


@refuses_bare("@limit('10/s')")
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

    return recording("limits", build, refuses_rate_limit="limit()")
