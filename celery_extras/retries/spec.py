"""What ``retry_policy(...)`` asks for, checked once at decoration time (no Celery import)."""

from __future__ import annotations

from dataclasses import dataclass

from ..admission.spec import KeyFunc, PolicyError
from ..checks import is_int
from .policies import RetryPolicy

__all__ = ["RetrySpec"]


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
