"""``concurrency()``: at most *n* running at once, stacked above ``@app.task``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..admission.decorators import recording, refuses_bare
from ..admission.spec import KeyFunc
from .spec import ConcurrencySpec

__all__ = ["concurrency"]

T = TypeVar("T")


@refuses_bare("@concurrency(2)")
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

    return recording(
        "concurrency",
        lambda name, _: ConcurrencySpec.build(name, n, key, scope, lease),
        refuses_rate_limit="concurrency()",
    )
