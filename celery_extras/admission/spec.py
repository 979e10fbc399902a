"""What every policy shares: the error a bad argument raises, scopes, and per-call keys.

Each capability's spec (``LimitSpec``, ``ConcurrencySpec``, ``RetrySpec``) is plain
data with no Celery import, checked once at decoration time; every error names the
task and the argument.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["SCOPES", "KeyFunc", "PolicyError", "call_key"]

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
