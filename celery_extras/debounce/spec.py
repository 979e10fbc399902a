"""What ``debounce(...)`` asks for, checked once at decoration time (no Celery import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..admission.spec import KeyFunc, PolicyError
from ..checks import is_number
from ..keyed.spec import MAX_LEASE, MIN_LEASE, lease_of, seconds_of

__all__ = ["MAX_LEASE", "MAX_WAIT", "MIN_LEASE", "DebounceSpec"]

#: Longest quiet period (and ``max_wait``): a debounced message waits that long before its
#: run, held in a worker or parked in the delay store; a day bounds what the store keeps.
MAX_WAIT = 86400.0


@dataclass(frozen=True)
class DebounceSpec:
    """Run a ``key(args, kwargs)`` once it has been quiet for *wait* seconds, with its last
    message's arguments, at most *max_wait* seconds after the first message of the burst
    (``None``: no bound); its holds are leased for *lease* seconds."""

    wait: float
    key: KeyFunc
    max_wait: float | None
    lease: float

    @classmethod
    def build(cls, task: str, wait: object, key: object, max_wait: object,
              lease: object) -> DebounceSpec:  # fmt: skip
        where = f"debounce() on task {task!r}"
        quiet = seconds_of(where, "wait", wait, MAX_WAIT)
        if not callable(key):
            raise PolicyError(f"{where}: key {key!r}: expected a callable (args, kwargs) -> key")
        if max_wait is not None and (not is_number(max_wait, minimum=quiet) or max_wait > MAX_WAIT):
            raise PolicyError(f"{where}: max_wait {max_wait!r}: expected None or seconds from "
                              f"wait ({quiet:g}) to {MAX_WAIT:g}")  # fmt: skip
        lease = lease_of(where, lease)
        return cls(quiet, key, None if max_wait is None else float(max_wait), lease)

    def describe(self) -> dict[str, Any]:
        return {"wait": self.wait, "max_wait": self.max_wait, "lease": self.lease}
