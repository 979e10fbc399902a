"""What ``limit(...)`` asks for, checked once at decoration time (no Celery import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..admission.spec import SCOPES, KeyFunc, PolicyError
from .rate import format_rate, parse_burst, parse_rate

__all__ = ["LimitSpec"]


@dataclass(frozen=True)
class LimitSpec:
    """A token-bucket limit: *rate* tasks per second, *burst* at once, per *scope* and key."""

    rate: float
    burst: int
    scope: str
    key: KeyFunc | None
    text: str

    @classmethod
    def build(cls, task: str, rate: object, burst: object, scope: object, key: object) -> LimitSpec:
        where = f"limit() on task {task!r}"
        try:
            per_second = parse_rate(rate)
        except ValueError as exc:
            raise PolicyError(f"{where}: {exc}") from None
        try:
            burst = 1 if burst is None else parse_burst(burst)
        except ValueError as exc:
            raise PolicyError(f"{where}: {exc}") from None
        if scope not in SCOPES:
            raise PolicyError(f"{where}: scope {scope!r}: expected 'global' or 'worker'")
        if key is not None and not callable(key):
            raise PolicyError(f"{where}: key {key!r}: expected a callable (args, kwargs) -> key")
        text = rate if isinstance(rate, str) else format_rate(per_second)
        return cls(per_second, burst, str(scope), key, text)

    def describe(self) -> dict[str, Any]:
        return {
            "rate": self.text,
            "burst": self.burst,
            "scope": self.scope,
            "per_key": self.key is not None,
        }
