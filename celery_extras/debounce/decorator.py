"""``debounce()``: a key runs once it has been quiet, cluster-wide, stacked above ``@app.task``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..admission.decorators import recording, refuses_bare
from ..admission.registry import TaskPolicies
from ..admission.sent import stamped_tasks
from ..admission.spec import KeyFunc
from .spec import DebounceSpec

__all__ = ["debounce"]

T = TypeVar("T")


@refuses_bare("@debounce(5.0, key=lambda args, kwargs: args[0])")
def debounce(wait: float, *, key: KeyFunc, max_wait: float | None = None,
             lease: float = 30.0) -> Callable[[T], T]:  # fmt: skip
    """Run a task once per burst of messages of a ``key(args, kwargs)``: once the key has been
    quiet for *wait* seconds (no new message of it), with the arguments of its last message,
    and at most *max_wait* seconds after the first message of the burst (Inngest's debounce,
    BullMQ's debounce mode).

    Cluster-wide, at most one run of a key at a time: a message that arrives while its key
    runs starts the next burst. Every earlier message of a burst is covered by its run:
    acked, it ends as if it had run with the run's outcome (its result, callbacks, chain and
    chord part). Holds are leased for *lease* seconds and renewed while held, so a dead
    worker's key frees itself.
    """

    def build(name: str, _: TaskPolicies) -> DebounceSpec:
        spec = DebounceSpec.build(name, wait, key, max_wait, lease)
        stamped_tasks.add(name)  # its producers stamp the send time
        return spec

    return recording("debounce", build)
