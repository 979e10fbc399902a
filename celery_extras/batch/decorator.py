"""``batch()``: one call of a task for many messages, stacked above ``@app.task``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from celery.local import PromiseProxy

from ..admission.decorators import recording, refuses_bare
from ..admission.spec import KeyFunc
from .runner import install_batch
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
    ``apply()`` and ``task_always_eager`` run each call as a batch of one.
    """
    record = recording("batch", lambda name, _: BatchSpec.build(name, size, wait, key))

    def decorate(task: T) -> T:
        task = record(task)
        if isinstance(task, PromiseProxy):  # a lazy task of an app not finalized yet
            task.__then__(_install_made, task)
        return task

    return decorate


def _install_made(proxy: Any) -> None:
    """Make the task of *proxy*, once made, a batched one (its ``apply()`` a batch of one),
    without waiting for its app's finalization (``apply()`` does not finalize it)."""
    install_batch(proxy._get_current_object())
