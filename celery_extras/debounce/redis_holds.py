"""Debounce holds on Redis: the rules of :mod:`.table` as one atomic Lua script per call.

Each key (a task and its debounce key) has one hash under a hash tag of its own (a
digest of task and key), so keys spread over a Redis Cluster's masters; the ids a run
covers are a list beside it, and the ending contexts of the confirmed ones a hash, in
the same tag. Every time is the *Redis server's* (``TIME``, in ms; or the testing
plugin's simulated time), so workers' clocks do not matter. A run that ends while its
key's next message is due publishes the key on one channel, so the worker holding that
message starts it at once. No Celery import.
"""

from __future__ import annotations

from typing import Any, cast

from ..admission.notices import Bucket, notice
from ..coalesce.redis_key_holds import RedisKeyHolds, ms, text
from ..scripts import NOW, load
from .table import DebounceFinished, DebounceVerdict

__all__ = ["SCRIPT", "RedisDebounce"]

#: The one script of every operation (``scripts/debounce.lua``), after the server's time.
SCRIPT = NOW + load("key_holds") + load("debounce") + load("key_ops")


class RedisDebounce(RedisKeyHolds):
    """The debounce holds of every key under *prefix* in *client*'s Redis (or Cluster)."""

    def __init__(self, client: Any, prefix: str) -> None:
        super().__init__(client, prefix, "debounce", SCRIPT)

    def ask(self, bucket: Bucket, mid: str, sent: float, holder: str, wait: float,
            max_wait: float | None, lease: float, retries: int = 0,
            context: str = "") -> DebounceVerdict:  # fmt: skip
        """What message *mid*, sent at *sent* (epoch seconds), does (see
        :meth:`.table.DebounceTable.ask`)."""
        longest = "" if max_wait is None else ms(max_wait)
        reply = self._call(bucket, "ask", mid, holder, round(sent * 1_000_000), ms(wait), longest,
                           ms(lease), retries, *bucket, context)  # fmt: skip
        due = int(reply[2]) / 1000 if len(reply) > 2 else 0.0
        ended = len(reply) > 3 and int(reply[3]) == 1
        return DebounceVerdict(cast("Any", text(reply[0])), text(reply[1]), due, ended)

    def finish(self, bucket: Bucket, mid: str, holder: str) -> DebounceFinished | None:
        """Run *mid* ended: what it covered (a next message due is told through the
        channel), or ``None`` when it was no longer the key's run."""
        reply = self._call(bucket, "finish", mid, holder)
        if not reply:
            return None
        if int(reply[0]):
            self.client.publish(self.channel, notice(*bucket))
        covered, contexts = self.covered(reply[2:])
        return DebounceFinished(covered, contexts, text(reply[1]))

    def park_next(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
                  lease: float) -> bool:  # fmt: skip
        """The next message *mid* was parked as *entry*, due in *seconds* (see the table's)."""
        return self._park(bucket, mid, holder, entry, seconds, lease)

    def drop(self, bucket: Bucket, mid: str) -> DebounceFinished | None:
        """Celery discarded *mid* before it ran (see the table's): what it covered."""
        reply = self._call(bucket, "dropped", mid, "")
        if not reply:
            return None
        covered, contexts = self.covered(reply[1:])
        return DebounceFinished(covered, contexts)
