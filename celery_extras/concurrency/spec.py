"""What ``concurrency(...)`` asks for, checked once at decoration time (no Celery import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..admission.spec import SCOPES, KeyFunc, PolicyError
from ..checks import is_int, is_number

__all__ = ["MAX_CONCURRENCY", "MAX_LEASE", "MIN_LEASE", "ConcurrencySpec"]


#: Bounds of ``concurrency(n, lease=...)``: a lease is renewed every third of itself, so
#: it must outlast a few event-loop turns; a day is the longest a dead worker's slot waits.
MIN_LEASE = 1.0
MAX_LEASE = 86400.0
MAX_CONCURRENCY = 1_000_000


@dataclass(frozen=True)
class ConcurrencySpec:
    """At most *n* tasks running at once per *scope* (and key), slots leased for *lease* s."""

    n: int
    scope: str
    key: KeyFunc | None
    lease: float

    @classmethod
    def build(
        cls, task: str, n: object, key: object, scope: object, lease: object
    ) -> ConcurrencySpec:
        where = f"concurrency() on task {task!r}"
        if not is_int(n, minimum=1, maximum=MAX_CONCURRENCY):
            raise PolicyError(
                f"{where}: n {n!r}: expected an int from 1 to {MAX_CONCURRENCY} "
                "(tasks running at once)"
            )
        if scope not in SCOPES:
            raise PolicyError(f"{where}: scope {scope!r}: expected 'global' or 'worker'")
        if key is not None and not callable(key):
            raise PolicyError(f"{where}: key {key!r}: expected a callable (args, kwargs) -> key")
        if not is_number(lease, minimum=MIN_LEASE) or lease > MAX_LEASE:
            raise PolicyError(
                f"{where}: lease {lease!r}: expected seconds from {MIN_LEASE:g} to {MAX_LEASE:g}"
            )
        return cls(n, str(scope), key, float(lease))

    def describe(self) -> dict[str, Any]:
        return {"n": self.n, "scope": self.scope, "per_key": self.key is not None,
                "lease": self.lease}  # fmt: skip
