"""Coalescing holds on Redis: the rules of :mod:`.table` as one atomic Lua script per call.

Each key (a task and its coalescing key) has one hash under a hash tag of its own
(a digest of task and key), so keys spread over a Redis Cluster's masters; the ids
a run covers are a list beside it, in the same tag. Every time is the *Redis
server's* (``TIME``, in ms) except a message's send time, which its producer stamped
(see :mod:`.sent`). A finished run whose key has a waiting run publishes the key on
one channel, so the worker holding the waiting run starts it at once. What every
key-run policy's Redis form does alike is :class:`~celery_extras.keyed.redis.RedisKeyRuns`'.
No Celery import.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ..admission.notices import Bucket
from ..admission.store_round import StoreCall
from ..keyed.redis import RUNS, RedisKeyRuns, ms, text
from ..scripts import NOW, load
from .table import CoalesceVerdict

__all__ = ["SCRIPT", "RedisHolds"]

#: The one script of every operation (``scripts/coalesce.lua``), after the server's time.
SCRIPT = NOW + load("key_holds") + load("key_cover") + load("coalesce") + load("key_ops")


def _sent_ms(seconds: float) -> int:
    """A send time in whole ms, rounded *up*: the store's clock keeps ms, and a message
    sent in the millisecond a run started may have been sent after it (and must not be
    covered by it: the run may have read what it changed); at worst a run too many."""
    return -(-round(seconds * 1_000_000) // 1000)


class RedisHolds(RedisKeyRuns):
    """The coalescing holds of every key under *prefix* in *client*'s Redis (or Cluster)."""

    def __init__(self, client: Any, prefix: str) -> None:
        super().__init__(client, prefix, "coalesce", SCRIPT)

    def ask_call(self, bucket: Bucket, mid: str, sent: float, holder: str, lease: float,
                 keep: str, retries: int, context: str = "", may_wait: bool = False
                 ) -> StoreCall:  # fmt: skip
        """:meth:`ask`'s script call, as data: it passes when the message runs."""
        return self._data(bucket, "ask", mid, holder, _sent_ms(sent), ms(lease), keep,
                          retries, *bucket, context, passes=RUNS,
                          may_wait=may_wait)  # fmt: skip

    def ask(self, bucket: Bucket, mid: str, sent: float, holder: str, lease: float,
            keep: str, retries: int, context: str = "") -> CoalesceVerdict:  # fmt: skip
        """What message *mid* (sent at *sent*, epoch seconds) does, keeping its ending
        *context* when covered (see :meth:`.table.ask`)."""
        return self.verdict(self.ask_call(bucket, mid, sent, holder, lease, keep, retries,
                                          context)())  # fmt: skip

    #: the waiting run *mid* was parked as *entry* (see :meth:`RedisKeyRuns.park`)
    park_wait = RedisKeyRuns.park

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
