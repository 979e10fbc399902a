"""``batch()``: one call of a task for many messages, stacked above ``@app.task``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..admission.decorators import recording, refuses_bare
from ..admission.spec import KeyFunc
from .spec import BatchSpec

__all__ = ["batch"]

T = TypeVar("T")


@refuses_bare("@batch(100, wait=1.0)")
def batch(size: int, *, wait: float, key: KeyFunc | None = None) -> Callable[[T], T]:
    """Run the task once for many messages: it is called with a list of
    :class:`~celery_extras.Call` (``id``, ``args``, ``kwargs``, ``headers``), at most *size*
    of them, once it has *size* calls or *wait* seconds after its first, and returns one
    result per call, in their order (or ``None``). ``key(args, kwargs)`` keeps a batch per
    key. Each call stays its own message: acked only after its batch ran, with its own
    result, callbacks and chord part; an exception or a retry applies to every call.
    """

    return recording("batch", lambda name, _: BatchSpec.build(name, size, wait, key))
