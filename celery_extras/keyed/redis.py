"""What the Redis forms of the key-run policies share (coalescing's, debounce's, memoize's).

Each key (a task and its policy's key) has one hash (:meth:`RedisKeyRuns.keys`, under a hash
tag so that a key's data shares a Redis Cluster slot); every operation is one call of the
policy's script (after the server's time and ``key_holds.lua``, followed by ``key_ops.lua``),
ARGV ``[operation, message id, holder, ...]``. A run that ends while its key has a message
to start publishes the key on the policy's channel. The endings a run owes stay in its key
from its ``finish`` until ``ended`` (:meth:`RedisKeyRuns.ended`); a key owing endings is
noted in the sorted set :meth:`RedisKeyRuns.owed_key` (outside its hash tag, so apart from
the script), where a sweep finds those whose finisher died (:meth:`RedisKeyRuns.owed_due`).
No Celery import.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, cast

from ..admission.notices import Bucket, bucket_tag, notice, parse_notice
from ..admission.store_round import ALWAYS, StoreCall, answered
from ..scripts import register
from .table import KeyFinished, KeyVerdict

__all__ = ["OWED", "RUNS", "RedisKeyRuns", "ms", "text"]

#: A round's predicate on an ask's reply: true exactly when the message runs.
RUNS = "reply[1] == 'run'"
#: Seconds a finisher's claim on the endings its run owes lasts (key_holds.lua's OWED_MS):
#: past it, a sweep of another worker claims and ends them.
OWED = 30.0
#: How long a covered message ended where it arrived is remembered as ended, ms.
ENDED_MS = 86_400_000


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
                    may_wait: bool = False, settle: bool = False) -> StoreCall:  # fmt: skip
        """:meth:`finish`'s script call, as data (see :attr:`StoreCall.may_wait`)."""
        op = "settle" if settle else "finish"
        return self._data(bucket, op, mid, holder, *ending, may_wait=may_wait)

    def finish(self, bucket: Bucket, mid: str, holder: str, *ending: Any,
               settle: bool = False) -> KeyFinished | None:  # fmt: skip
        """Run *mid* ended: what it covered (a message waiting is told through the channel),
        or ``None`` when it was no longer the key's run. *settle*: the store keeps what it
        covered owed until :meth:`ended` (and answers a finish asked again with it)."""
        return self.finished(bucket, self.finish_call(bucket, mid, holder, *ending,
                                                      settle=settle)())  # fmt: skip

    def finished(self, bucket: Bucket, reply: Any) -> KeyFinished | None:
        """:meth:`finish`'s answer from its script's *reply* (raised if a round's error)."""
        reply = answered(reply)
        if not reply:
            return None
        if int(reply[0]):
            self.client.publish(self.channel, notice(*bucket))
        covered, contexts = self.covered(reply[2:])
        return KeyFinished(covered, text(reply[1]), contexts)

    def ended(self, bucket: Bucket, by: str, holder: str) -> int:
        """The endings run *by* owed are published: forgotten (the key no longer noted once
        it owes none); how many runs of the key still owe endings."""
        left = int(self._call(bucket, "ended", by, holder))
        if not left:
            self.forget_owed(bucket)
        return left

    def claim_owed(self, bucket: Bucket, holder: str) -> tuple[int, list[tuple[str, KeyFinished]]]:
        """The endings of *bucket* whose claim ran out (or *holder*'s), claimed by *holder*:
        how many runs of the key owe endings now, and each claimed run with what it covered."""
        reply = self._call(bucket, "owed", "", holder)
        claimed = []
        for by, ids, contexts in reply[1]:
            covered, kept = self.covered([ids, contexts])
            claimed.append((text(by), KeyFinished(covered, "", kept)))
        return int(reply[0]), claimed

    def mark_ended(self, bucket: Bucket, mid: str) -> None:
        """Covered message *mid* was ended where it arrived: a delivery of it again (its
        ack lost) is acked without a second ending, for a day."""
        self.client.set(f"{self.hash_key(*bucket)}:e:{mid}", 1, px=ENDED_MS)

    def was_ended(self, bucket: Bucket, mid: str) -> bool:
        """Whether covered message *mid* was ended already (:meth:`mark_ended`)."""
        return bool(self.client.exists(f"{self.hash_key(*bucket)}:e:{mid}"))

    def owed_key(self) -> str:
        """The sorted set of keys that owe endings, by when their claim runs out (ms)."""
        return f"{self.prefix}:{self.kind}:owed"

    def note_owed(self, bucket: Bucket, seconds: float = OWED) -> None:
        """*bucket* owes endings: a sweep looks at it in *seconds*."""
        self.client.zadd(self.owed_key(), {notice(*bucket): (time.time() + seconds) * 1000})

    def forget_owed(self, bucket: Bucket) -> None:
        """*bucket* owes no endings any more."""
        self.client.zrem(self.owed_key(), notice(*bucket))

    def owed_due(self, limit: int) -> list[Bucket]:
        """At most *limit* keys whose owed endings' claim may have run out."""
        raw = self.client.zrangebyscore(self.owed_key(), "-inf", time.time() * 1000,
                                        start=0, num=limit)  # fmt: skip
        return [bucket for one in raw if (bucket := parse_notice(one)) is not None]

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
