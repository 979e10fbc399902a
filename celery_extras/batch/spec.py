"""What ``batch(...)`` asks for, checked once at decoration time (no Celery import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..admission.spec import KeyFunc, PolicyError
from ..checks import is_int, is_number

__all__ = ["MAX_SIZE", "MAX_WAIT", "BatchSpec"]

#: Bounds of ``batch(size, wait=...)``: a batch is one job in the pool and every call of it
#: waits unacked in the worker, so neither may grow without bound.
MAX_SIZE = 10_000
MAX_WAIT = 3600.0


@dataclass(frozen=True)
class BatchSpec:
    """Calls run together, at most *size* at a time, *wait* seconds after the first at the
    latest; one batch at a time per ``key(args, kwargs)`` when *key* is given."""

    size: int
    wait: float
    key: KeyFunc | None

    @classmethod
    def build(cls, task: str, size: object, wait: object, key: object) -> BatchSpec:
        where = f"batch() on task {task!r}"
        if not is_int(size, minimum=1, maximum=MAX_SIZE):
            raise PolicyError(f"{where}: size {size!r}: expected an int from 1 to {MAX_SIZE}")
        if not is_number(wait, minimum=0.0) or wait > MAX_WAIT:
            raise PolicyError(f"{where}: wait {wait!r}: expected seconds from 0 to {MAX_WAIT:g}")
        if key is not None and not callable(key):
            raise PolicyError(f"{where}: key {key!r}: expected a callable (args, kwargs) -> key")
        return cls(int(size), float(wait), key)

    def describe(self) -> dict[str, Any]:
        return {"size": self.size, "wait": self.wait, "per_key": self.key is not None}
