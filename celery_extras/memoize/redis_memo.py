"""Memoize on Redis: the rules of :mod:`.table` as one atomic Lua script per call.

A task's keys share one hash tag (a digest of the task's name), so that a call may reach
the task's sorted set of kept keys (its LRU) beside the key's own hash, on one Redis
Cluster slot; every time is the Redis server's. No Celery import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

from ..admission.notices import Bucket, bucket_tag
from ..admission.store_round import StoreCall
from ..keyed.redis import RUNS, RedisKeyRuns, ms, text
from ..keyed.table import KeyVerdict
from ..scripts import NOW, load

__all__ = ["SCRIPT", "RedisMemo"]

#: The one script of every operation (``scripts/memoize.lua``), after the server's time.
SCRIPT = NOW + load("key_holds") + load("key_cover") + load("memoize") + load("key_ops")


class RedisMemo(RedisKeyRuns):
    """The runs and kept results of every key under *prefix* in *client*'s Redis."""

    def __init__(self, client: Any, prefix: str) -> None:
        super().__init__(client, prefix, "memoize", SCRIPT)

    def task_prefix(self, name: str) -> str:
        """Where task *name*'s keys are, under its hash tag."""
        return f"{self.prefix}:memoize:{bucket_tag(name, '')}"

    def hash_key(self, name: str, key: str) -> str:
        digest = hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()[:24]
        return f"{self.task_prefix(name)}:{digest}"

    def keys(self, bucket: Bucket) -> Sequence[str]:
        return (self.hash_key(*bucket), f"{self.task_prefix(bucket[0])}:lru")

    def ask_call(self, bucket: Bucket, mid: str, holder: str, lease: float, retries: int = 0,
                 context: str = "", may_wait: bool = False) -> StoreCall:  # fmt: skip
        """:meth:`ask`'s script call, as data: it passes when the message runs."""
        return self._data(bucket, "ask", mid, holder, ms(lease), retries, *bucket, context,
                          passes=RUNS, may_wait=may_wait)  # fmt: skip

    def ask(self, bucket: Bucket, mid: str, holder: str, lease: float, retries: int = 0,
            context: str = "") -> KeyVerdict:  # fmt: skip
        """What message *mid* does (see :meth:`.table.MemoizeTable.ask`)."""
        return self.verdict(self.ask_call(bucket, mid, holder, lease, retries, context)())

    def finish_call(self, bucket: Bucket, mid: str, holder: str, *ending: Any,
                    may_wait: bool = False, settle: bool = False) -> StoreCall:  # fmt: skip
        """The finish of run *mid*, its result kept *ending* ``[0]`` seconds (0: not kept),
        then at most *ending* ``[1]`` keys of the task kept."""
        kept, max_keys = ending
        kept_ms = ms(kept) if kept > 0 else 0
        return super().finish_call(bucket, mid, holder, kept_ms, max_keys, may_wait=may_wait,
                                   settle=settle)  # fmt: skip

    def invalidate(self, bucket: Bucket) -> bool:
        """Forget the key's kept result: whether it had one."""
        return bool(self._call(bucket, "invalidate", "", ""))

    def running(self, bucket: Bucket) -> bool:
        """Whether the key has a run in flight (a message of it now joins that run)."""
        return self.client.hget(self.hash_key(*bucket), "run") is not None

    def kept(self, name: str) -> int:
        """How many keys of task *name* have a result kept (expired ones included until
        they are evicted)."""
        return int(self.client.zcard(f"{self.task_prefix(name)}:lru"))

    def listing(self, name: str) -> Iterator[str]:
        """The keys of task *name* with a result kept, most recently used first."""
        for raw in self.client.zrevrange(f"{self.task_prefix(name)}:lru", 0, -1):
            key = self.client.hget(text(raw), "k")
            if key is not None:
                yield text(key)
