"""What ``coalesce(...)`` asks for, checked once at decoration time (no Celery import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..admission.spec import KeyFunc, PolicyError
from ..keyed.spec import MAX_LEASE, MIN_LEASE, lease_of
from .table import KEEP

__all__ = ["MAX_LEASE", "MIN_LEASE", "CoalesceSpec"]


@dataclass(frozen=True)
class CoalesceSpec:
    """One run at a time per ``key(args, kwargs)``; *keep* says whose arguments the waiting
    run takes; holds are leased for *lease* seconds."""

    key: KeyFunc
    keep: str
    lease: float

    @classmethod
    def build(cls, task: str, key: object, keep: object, lease: object) -> CoalesceSpec:
        where = f"coalesce() on task {task!r}"
        if not callable(key):
            raise PolicyError(f"{where}: key {key!r}: expected a callable (args, kwargs) -> key")
        if keep not in KEEP:
            raise PolicyError(f"{where}: keep {keep!r}: expected 'first' or 'last'")
        return cls(key, str(keep), lease_of(where, lease))

    def describe(self) -> dict[str, Any]:
        return {"keep": self.keep, "lease": self.lease}
