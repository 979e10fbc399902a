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

import math
from typing import Any, cast

from ..admission.notices import Bucket, bucket_tag, notice
from ..scripts import NOW, load, register
from .table import DebounceFinished, DebounceVerdict

__all__ = ["SCRIPT", "RedisDebounce"]

#: The one script of every operation (``scripts/debounce.lua``), after the server's time.
SCRIPT = NOW + load("key_holds") + load("debounce")


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _ended(parts: list[Any]) -> tuple[list[str], dict[str, str]]:
    """The ids and their non-empty contexts of a ``finish``/``dropped`` reply's tail."""
    ids = [_text(one) for one in parts[0]]
    texts = [_text(one) if one else "" for one in parts[1]]
    return ids, {one: text for one, text in zip(ids, texts, strict=False) if text}


class RedisDebounce:
    """The debounce holds of every key under *prefix* in *client*'s Redis (or Cluster)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.channel = f"{prefix}:debounce:ended"
        self._script = register(client, SCRIPT)

    def hash_key(self, name: str, key: str) -> str:
        """The hash of ``(name, key)``, under a hash tag of its own."""
        return f"{self.prefix}:debounce:{bucket_tag(name, key)}"

    def _call(self, bucket: Bucket, *args: Any) -> Any:
        return self._script(keys=[self.hash_key(*bucket)], args=list(args))

    def ask(self, bucket: Bucket, mid: str, sent: float, holder: str, wait: float,
            max_wait: float | None, lease: float, retries: int = 0,
            context: str = "") -> DebounceVerdict:  # fmt: skip
        """What message *mid*, sent at *sent* (epoch seconds), does (see
        :meth:`.table.DebounceTable.ask`)."""
        longest = "" if max_wait is None else _ms(max_wait)
        reply = self._call(bucket, "ask", mid, holder, round(sent * 1_000_000), _ms(wait), longest,
                           _ms(lease), retries, *bucket, context)  # fmt: skip
        due = int(reply[2]) / 1000 if len(reply) > 2 else 0.0
        ended = len(reply) > 3 and int(reply[3]) == 1
        return DebounceVerdict(cast("Any", _text(reply[0])), _text(reply[1]), due, ended)

    def finish(self, bucket: Bucket, mid: str, holder: str) -> DebounceFinished | None:
        """Run *mid* ended: what it covered (a next message due is told through the
        channel), or ``None`` when it was no longer the key's run."""
        reply = self._call(bucket, "finish", mid, holder)
        if not reply:
            return None
        if int(reply[0]):
            self.client.publish(self.channel, notice(*bucket))
        covered, contexts = _ended(reply[2:])
        return DebounceFinished(covered, contexts, _text(reply[1]))

    def step_aside(self, bucket: Bucket, mid: str, holder: str, seconds: float,
                   lease: float) -> bool:  # fmt: skip
        """Run *mid* goes on elsewhere: held *seconds* + *lease* for whoever receives it."""
        return bool(self._call(bucket, "aside", mid, holder, _ms(seconds + lease)))

    def park_next(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
                  lease: float) -> bool:  # fmt: skip
        """The next message *mid* was parked as *entry*, due in *seconds* (see the table's)."""
        return bool(self._call(bucket, "parked", mid, holder, _ms(seconds + lease), entry))

    def drop(self, bucket: Bucket, mid: str) -> DebounceFinished | None:
        """Celery discarded *mid* before it ran (see the table's): what it covered."""
        reply = self._call(bucket, "dropped", mid, "")
        if not reply:
            return None
        covered, contexts = _ended(reply[1:])
        return DebounceFinished(covered, contexts)

    def forget(self, bucket: Bucket, mid: str, holder: str) -> None:
        """The next message *mid* was dropped by *holder* (the broker delivers it again)."""
        self._call(bucket, "forget", mid, holder)

    def renew(self, bucket: Bucket, ids: list[str], holder: str, lease: float) -> list[str]:
        """Extend *holder*'s holds among *ids*; the ids whose hold had run out."""
        lost = self._call(bucket, "renew", "", holder, _ms(lease), *ids)
        return [_text(one) for one in lost]
