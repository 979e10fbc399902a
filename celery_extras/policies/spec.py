"""What ``limit(...)`` and ``retry_policy(...)`` ask for, checked once at decoration time.

Plain data with no Celery import: the decorators build these, the worker glue
reads them. Every error names the task and the argument.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..checks import is_int, is_number
from .rate import format_rate, parse_burst, parse_rate
from .retry_limiters import RetryPolicy

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_LEASE",
    "MIN_LEASE",
    "SCOPES",
    "ConcurrencySpec",
    "KeyFunc",
    "LimitSpec",
    "PolicyError",
    "RetrySpec",
    "call_key",
]

SCOPES = ("global", "worker")

#: ``key(args, kwargs) -> str``: which bucket (or failure memory) a call belongs to.
KeyFunc = Callable[[Sequence[Any], Mapping[str, Any]], Any]


def call_key(
    name: str, key: KeyFunc | None, request: Any, kind: str, shared: str, log: logging.Logger
) -> str:
    """*key* on *request*'s arguments, as text; ``""`` (the task's shared *shared*) when the
    task has no key, or when the key fails (logged on *log*, naming the task)."""
    if key is None:
        return ""
    try:
        return str(key(request.args, request.kwargs))
    except Exception:
        log.exception("celery-extras: %s key of %s failed; using its shared %s", kind, name, shared)
        return ""


class PolicyError(ValueError):
    """A limit or retry policy was declared with a bad argument."""


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


@dataclass(frozen=True)
class RetrySpec:
    """Retry on *on* after the wait *policy* gives, at most *max_retries* times."""

    on: tuple[type[BaseException], ...]
    policy: RetryPolicy
    max_retries: int | None
    per_item: bool
    key: KeyFunc | None

    @classmethod
    def build(
        cls, task: str, on: object, policy: object, max_retries: object, per_item: object,
        key: object,
    ) -> RetrySpec:  # fmt: skip
        where = f"retry_policy() on task {task!r}"
        exceptions = on if isinstance(on, tuple | list) else (on,)
        if not exceptions or not all(
            isinstance(e, type) and issubclass(e, BaseException) for e in exceptions
        ):
            raise PolicyError(f"{where}: on {on!r}: expected an exception class or a tuple of them")
        if not isinstance(policy, RetryPolicy):
            raise PolicyError(
                f"{where}: policy {policy!r}: expected a retry policy such as "
                "ExponentialBackoff(base, cap)"
            )
        try:
            policy.check()
        except ValueError as exc:
            raise PolicyError(f"{where}: policy {exc}") from None
        if max_retries is not None and not is_int(max_retries, minimum=0):
            raise PolicyError(f"{where}: max_retries {max_retries!r}: expected None or an int >= 0")
        if not isinstance(per_item, bool):
            raise PolicyError(f"{where}: per_item {per_item!r}: expected True or False")
        if key is not None and not callable(key):
            raise PolicyError(f"{where}: key {key!r}: expected a callable (args, kwargs) -> key")
        if per_item and key is None:
            raise PolicyError(f"{where}: per_item=True needs key=callable(args, kwargs)")
        if key is not None and not per_item:
            raise PolicyError(f"{where}: key is only used with per_item=True")
        return cls(tuple(exceptions), policy, max_retries, per_item, key)


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
