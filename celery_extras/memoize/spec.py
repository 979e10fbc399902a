"""What ``memoize(...)`` asks for, checked once at decoration time (no Celery import)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..admission.spec import KeyFunc, PolicyError
from ..keyed.spec import lease_of, seconds_of

__all__ = ["MAX_KEYS", "MAX_TTL", "MemoizeSpec", "arguments_key"]

#: Longest ``ttl``: a result is reused at most a month (the result backend must keep it).
MAX_TTL = 30 * 86400.0
#: Most keys a task may keep (``max_keys``).
MAX_KEYS = 10_000_000


def arguments_key(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The default key: the call's arguments, canonically encoded (JSON, keys sorted, no
    spaces; a tuple as a list, so that the key a client makes from its arguments is the one a
    worker makes from the message's). A value JSON cannot encode is encoded by its ``repr``."""
    return json.dumps([list(args), dict(kwargs)], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=repr)  # fmt: skip


@dataclass(frozen=True)
class MemoizeSpec:
    """Reuse a ``key(args, kwargs)``'s result for *ttl* seconds; keep at most *max_keys* keys,
    least recently used first out; a run's hold is leased for *lease* seconds."""

    ttl: float
    key: KeyFunc
    max_keys: int
    lease: float
    #: the key is the call's arguments (no ``key`` given)
    by_arguments: bool = True

    @classmethod
    def build(cls, task: str, ttl: object, key: object, max_keys: object,
              lease: object) -> MemoizeSpec:  # fmt: skip
        where = f"memoize() on task {task!r}"
        seconds = seconds_of(where, "ttl", ttl, MAX_TTL)
        if key is not None and not callable(key):
            raise PolicyError(f"{where}: key {key!r}: expected None (the arguments) or a "
                              f"callable (args, kwargs) -> key")  # fmt: skip
        if type(max_keys) is not int or not 1 <= max_keys <= MAX_KEYS:
            raise PolicyError(f"{where}: max_keys {max_keys!r}: expected an int from 1 to "
                              f"{MAX_KEYS}")  # fmt: skip
        return cls(seconds, key if callable(key) else arguments_key, max_keys,
                   lease_of(where, lease), key is None)  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {"ttl": self.ttl, "max_keys": self.max_keys, "lease": self.lease,
                "key": "arguments" if self.by_arguments else "key()"}  # fmt: skip
