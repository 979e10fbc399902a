"""What the Redis forms of the key-run policies share (coalescing's, debounce's, memoize's).

Each key (a task and its policy's key) has one hash (:meth:`RedisKeyRuns.keys`, under a hash
tag so that a key's data shares a Redis Cluster slot); every operation is one call of the
policy's script (after the server's time and ``key_holds.lua``, followed by ``key_ops.lua``),
ARGV ``[operation, message id, holder, ...]``. A run that ends while its key has a message
to start publishes the key on the policy's channel. No Celery import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

from ..admission.notices import Bucket, bucket_tag, notice
from ..admission.store_round import ALWAYS, StoreCall, answered
from ..scripts import register
from .table import KeyFinished, KeyVerdict

__all__ = ["RUNS", "RedisKeyRuns", "ms", "text"]

#: A round's predicate on an ask's reply: true exactly when the message runs.
RUNS = "reply[1] == 'run'"


def ms(seconds: float) -> int:
    """*seconds* as whole milliseconds, rounded up, at least one."""
    return max(1, math.ceil(seconds * 1000))


def text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class RedisKeyRuns:
    """The holds of one policy (*kind*: ``coalesce``, ``debounce``, ``memoize``) of every key
    under *prefix* in *client*'s Redis (or Cluster), kept by *script*."""

    def __init__(self, client: Any, prefix: str, kind: str, script: str) -> None:
        self.client = client
        self.prefix = prefix
        self.kind = kind
        self.channel = f"{prefix}:{kind}:ended"
        self._script = register(client, script)

    def hash_key(self, name: str, key: str) -> str:
        """The hash of ``(name, key)``, under a hash tag of its own."""
        return f"{self.prefix}:{self.kind}:{bucket_tag(name, key)}"

    def keys(self, bucket: Bucket) -> Sequence[str]:
        """The script's KEYS for *bucket* (its hash first)."""
        return (self.hash_key(*bucket),)

    def _data(self, bucket: Bucket, *args: Any, passes: str = ALWAYS,
              may_wait: bool = False) -> StoreCall:  # fmt: skip
        return StoreCall(self._script, tuple(self.keys(bucket)), args, passes, may_wait)

    def _call(self, bucket: Bucket, *args: Any) -> Any:
        return self._script(keys=self.keys(bucket), args=list(args))

    @staticmethod
    def verdict(reply: Any) -> KeyVerdict:
        """An ask's answer from its script's *reply* (raised if a round's error)."""
        reply = answered(reply)
        due = int(reply[2]) / 1000 if len(reply) > 2 else 0.0
        ended = len(reply) > 3 and int(reply[3]) == 1
        return KeyVerdict(cast("Any", text(reply[0])), text(reply[1]), due, ended)

    def finish_call(self, bucket: Bucket, mid: str, holder: str, *ending: Any,
                    may_wait: bool = False) -> StoreCall:  # fmt: skip
        """:meth:`finish`'s script call, as data (see :attr:`StoreCall.may_wait`)."""
        return self._data(bucket, "finish", mid, holder, *ending, may_wait=may_wait)

    def finish(self, bucket: Bucket, mid: str, holder: str, *ending: Any) -> KeyFinished | None:
        """Run *mid* ended: what it covered (a message waiting is told through the channel),
        or ``None`` when it was no longer the key's run."""
        return self.finished(bucket, self.finish_call(bucket, mid, holder, *ending)())

    def finished(self, bucket: Bucket, reply: Any) -> KeyFinished | None:
        """:meth:`finish`'s answer from its script's *reply* (raised if a round's error)."""
        reply = answered(reply)
        if not reply:
            return None
        if int(reply[0]):
            self.client.publish(self.channel, notice(*bucket))
        covered, contexts = self.covered(reply[2:])
        return KeyFinished(covered, text(reply[1]), contexts)

    def drop(self, bucket: Bucket, mid: str) -> KeyFinished | None:
        """Celery discarded *mid* before it ran (see the tables'): what it covered."""
        reply = self._call(bucket, "dropped", mid, "")
        if not reply:
            return None
        covered, contexts = self.covered(reply[1:])
        return KeyFinished(covered, "", contexts)

    def step_aside(self, bucket: Bucket, mid: str, holder: str, seconds: float,
                   lease: float) -> bool:  # fmt: skip
        """Run *mid* goes on elsewhere: held *seconds* + *lease* for whoever receives it."""
        return bool(self._call(bucket, "aside", mid, holder, ms(seconds + lease)))

    def park(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
             lease: float) -> bool:  # fmt: skip
        """The waiting hold *mid* was parked as *entry*, due in *seconds*."""
        return bool(self._call(bucket, "parked", mid, holder, ms(seconds + lease), entry))

    def forget(self, bucket: Bucket, mid: str, holder: str) -> None:
        """The waiting hold *mid* was dropped by *holder* (the broker delivers it again)."""
        self._call(bucket, "forget", mid, holder)

    def renew(self, bucket: Bucket, ids: list[str], holder: str, lease: float) -> list[str]:
        """Extend *holder*'s holds among *ids*; the ids whose hold had run out."""
        lost = self._call(bucket, "renew", "", holder, ms(lease), *ids)
        return [text(one) for one in lost]

    @staticmethod
    def covered(parts: list[Any]) -> tuple[list[str], dict[str, str]]:
        """The covered ids and their non-empty contexts of a ``finish``/``dropped`` reply's
        tail (``[ids, contexts]``; a flat list of ids from a script before contexts)."""
        if len(parts) == 2 and all(isinstance(part, list) for part in parts):
            ids = [text(one) for one in parts[0]]
            texts = [text(one) if one else "" for one in parts[1]]
            return ids, {one: t for one, t in zip(ids, texts, strict=False) if t}
        return [text(one) for one in parts], {}
