"""Debounce holds on Redis: the rules of :mod:`.table` as one atomic Lua script per call.

Each key (a task and its debounce key) has one hash under a hash tag of its own (a
digest of task and key), so keys spread over a Redis Cluster's masters; the ids a run
covers are a list beside it, and the ending contexts of the confirmed ones a hash, in
the same tag. Every time is the *Redis server's* (``TIME``, in ms; or the testing
plugin's simulated time), so workers' clocks do not matter. A run that ends while its
key's next message is due publishes the key on one channel, so the worker holding that
message starts it at once. What every key-run policy's Redis form does alike is
:class:`~celery_extras.keyed.redis.RedisKeyRuns`'. No Celery import.
"""

from __future__ import annotations

from typing import Any

from ..admission.notices import Bucket
from ..keyed.redis import RedisKeyRuns, ms
from ..scripts import NOW, load
from .table import DebounceVerdict

__all__ = ["SCRIPT", "RedisDebounce"]

#: The one script of every operation (``scripts/debounce.lua``), after the server's time.
SCRIPT = NOW + load("key_holds") + load("debounce") + load("key_ops")


class RedisDebounce(RedisKeyRuns):
    """The debounce holds of every key under *prefix* in *client*'s Redis (or Cluster)."""

    def __init__(self, client: Any, prefix: str) -> None:
        super().__init__(client, prefix, "debounce", SCRIPT)

    def ask(self, bucket: Bucket, mid: str, sent: float, holder: str, wait: float,
            max_wait: float | None, lease: float, retries: int = 0,
            context: str = "") -> DebounceVerdict:  # fmt: skip
        """What message *mid*, sent at *sent* (epoch seconds), does (see
        :meth:`.table.DebounceTable.ask`)."""
        longest = "" if max_wait is None else ms(max_wait)
        return self.verdict(self._call(bucket, "ask", mid, holder, round(sent * 1_000_000),
                                       ms(wait), longest, ms(lease), retries, *bucket,
                                       context))  # fmt: skip

    #: the next message *mid* was parked as *entry* (see :meth:`RedisKeyRuns.park`)
    park_next = RedisKeyRuns.park
