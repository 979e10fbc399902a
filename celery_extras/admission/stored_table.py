"""Run-time values per task name in one Redis hash, read again at most every few seconds.

The run-time rates of ``celery extras limit`` and caps of ``celery extras
concurrency`` live this way: a worker reads the hash once per *refresh* seconds
(or at once after :meth:`StoredTable.expire`), keeping the entries its *parse*
accepts. No Celery import: the client is any ``redis.Redis`` or ``redis.RedisCluster``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

__all__ = ["StoredTable"]

V = TypeVar("V")


class StoredTable(Generic[V]):
    """The hash *key* in *client*'s Redis: ``{task name: value}``, parsed by *parse* and cached.

    ``parse(name, raw)`` returns the value, or ``None`` to skip an entry.
    """

    def __init__(
        self,
        client: Any,
        key: str,
        parse: Callable[[str, Any], V | None],
        refresh: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.key = key
        self.parse = parse
        self.refresh = refresh
        self.clock = clock
        self._values: dict[str, V] = {}
        self._until = -math.inf

    def values(self) -> dict[str, V]:
        """The parsed entries, read again once *refresh* seconds passed since the last read."""
        now = self.clock()
        if now >= self._until:
            parsed: dict[str, V] = {}
            for name, raw in self.raw().items():
                text = name.decode() if isinstance(name, bytes) else str(name)
                value = self.parse(text, raw)
                if value is not None:
                    parsed[text] = value
            self._values, self._until = parsed, now + self.refresh
        return self._values

    def expire(self) -> None:
        """Read the hash again at the next :meth:`values` (an entry was just changed)."""
        self._until = -math.inf

    def set(self, name: str, raw: str | None) -> None:
        """Store (or with ``None`` remove) the entry of *name*."""
        if raw is None:
            self.client.hdel(self.key, name)
        else:
            self.client.hset(self.key, name, raw)
        self.expire()

    def raw(self) -> dict[Any, Any]:
        """Every stored entry, raw."""
        return cast("dict[Any, Any]", self.client.hgetall(self.key))
