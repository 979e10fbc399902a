"""Coalescing holds on Redis: the rules of :mod:`.table` as one atomic Lua script per call.

Each key (a task and its coalescing key) has one hash under a hash tag of its own
(a digest of task and key), so keys spread over a Redis Cluster's masters; the ids
a run covers are a list beside it, in the same tag. Every time is the *Redis
server's* (``TIME``, in ms) except a message's send time, which its producer stamped
(see :mod:`.sent`). A finished run whose key has a waiting run publishes the key on
one channel, so the worker holding the waiting run starts it at once. No Celery import.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

from ..admission.notices import Bucket, notice
from ..admission.store_round import ALWAYS, StoreCall, answered
from ..scripts import NOW, load
from .redis_key_holds import RedisKeyHolds, ms, text
from .table import CoalesceFinished, CoalesceVerdict

__all__ = ["SCRIPT", "RedisHolds"]

#: The one script of every operation (``scripts/coalesce.lua``), after the server's time.
SCRIPT = NOW + load("key_holds") + load("coalesce") + load("key_ops")


def _sent_ms(seconds: float) -> int:
    """A send time in whole ms, rounded *up*: the store's clock keeps ms, and a message
    sent in the millisecond a run started may have been sent after it (and must not be
    covered by it: the run may have read what it changed); at worst a run too many."""
    return -(-round(seconds * 1_000_000) // 1000)


class RedisHolds(RedisKeyHolds):
    """The coalescing holds of every key under *prefix* in *client*'s Redis (or Cluster)."""

    def __init__(self, client: Any, prefix: str) -> None:
        super().__init__(client, prefix, "coalesce", SCRIPT)

    def _data(self, bucket: Bucket, *args: Any, passes: str = ALWAYS,
              may_wait: bool = False) -> StoreCall:  # fmt: skip
        return StoreCall(self._script, (self.hash_key(*bucket),), args, passes, may_wait)

    def ask_call(self, bucket: Bucket, mid: str, sent: float, holder: str, lease: float,
                 keep: str, retries: int, context: str = "", may_wait: bool = False
                 ) -> StoreCall:  # fmt: skip
        """:meth:`ask`'s script call, as data: it passes when the message runs."""
        return self._data(bucket, "ask", mid, holder, _sent_ms(sent), ms(lease), keep,
                          retries, *bucket, context, passes="reply[1] == 'run'",
                          may_wait=may_wait)  # fmt: skip

    def ask(self, bucket: Bucket, mid: str, sent: float, holder: str, lease: float,
            keep: str, retries: int, context: str = "") -> CoalesceVerdict:  # fmt: skip
        """What message *mid* (sent at *sent*, epoch seconds) does, keeping its ending
        *context* when covered (see :meth:`.table.ask`)."""
        return self.verdict(self.ask_call(bucket, mid, sent, holder, lease, keep, retries,
                                          context)())  # fmt: skip

    @staticmethod
    def verdict(reply: Any) -> CoalesceVerdict:
        """:meth:`ask`'s answer from its script's *reply* (raised if a round's error)."""
        reply = answered(reply)
        due = int(reply[2]) / 1000 if len(reply) > 2 else 0.0
        ended = len(reply) > 3 and int(reply[3]) == 1
        return CoalesceVerdict(cast("Any", text(reply[0])), text(reply[1]), due, ended)

    def finish_call(self, bucket: Bucket, mid: str, holder: str,
                    may_wait: bool = False) -> StoreCall:  # fmt: skip
        """:meth:`finish`'s script call, as data (see :attr:`StoreCall.may_wait`)."""
        return self._data(bucket, "finish", mid, holder, may_wait=may_wait)

    def finish(self, bucket: Bucket, mid: str, holder: str) -> CoalesceFinished | None:
        """Run *mid* ended: what it covered (a run waiting is told through the channel), or
        ``None`` when it was no longer the key's run."""
        return self.finished(bucket, self.finish_call(bucket, mid, holder)())

    def finished(self, bucket: Bucket, reply: Any) -> CoalesceFinished | None:
        """:meth:`finish`'s answer from its script's *reply* (raised if a round's error)."""
        reply = answered(reply)
        if not reply:
            return None
        if int(reply[0]):
            self.client.publish(self.channel, notice(*bucket))
        covered, contexts = self.covered(reply[2:])
        return CoalesceFinished(covered, text(reply[1]), contexts)

    def park_wait(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
                  lease: float) -> bool:  # fmt: skip
        """The waiting run *mid* was parked as *entry*, due in *seconds* (see the table's)."""
        return self._park(bucket, mid, holder, entry, seconds, lease)

    def drop(self, bucket: Bucket, mid: str) -> CoalesceFinished | None:
        """Celery discarded *mid* before it ran (see the table's): what it covered."""
        reply = self._call(bucket, "dropped", mid, "")
        if not reply:
            return None
        covered, contexts = self.covered(reply[1:])
        return CoalesceFinished(covered, "", contexts)

    def listing(self) -> Iterator[dict[str, Any]]:
        """Every key with a run, a waiting run or orphans: task, key, and its holds."""
        for raw_key in self.client.scan_iter(match=f"{self.prefix}:{self.kind}:{{*}}", count=500):
            fields = self.client.hgetall(raw_key)
            if not fields:
                continue
            state = {text(k): text(v) for k, v in fields.items()}
            out: dict[str, Any] = {"task": state.get("n", "?"), "key": state.get("k", "?")}
            for hold in ("run", "wait"):
                out[hold] = _parse(state.get(hold))
            out["covered"] = sum(1 for f in state if f.startswith("b:"))
            orphans = _parse(state.get("o"))
            out["orphans"] = len(orphans) if isinstance(orphans, list) else 0
            yield out


def _parse(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None
