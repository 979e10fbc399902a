"""What ``coalesce(...)`` asks for, checked once at decoration time (no Celery import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..admission.spec import KeyFunc, PolicyError
from ..checks import is_number
from .table import KEEP

__all__ = ["MAX_LEASE", "MIN_LEASE", "CoalesceSpec"]

#: Bounds of ``coalesce(lease=...)``: a hold is renewed every third of its lease, so it must
#: outlast a few event-loop turns; a day is the longest a dead worker's key stays taken.
MIN_LEASE = 1.0
MAX_LEASE = 86400.0


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
        if not is_number(lease, minimum=MIN_LEASE) or lease > MAX_LEASE:
            raise PolicyError(
                f"{where}: lease {lease!r}: expected seconds from {MIN_LEASE:g} to {MAX_LEASE:g}"
            )
        return cls(key, str(keep), float(lease))

    def describe(self) -> dict[str, Any]:
        return {"keep": self.keep, "lease": self.lease}
