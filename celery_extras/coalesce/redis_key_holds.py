"""What the Redis forms of the key holds share: coalescing's and debounce's.

Each key (a task and its policy's key) has one hash under a hash tag of its own (a digest
of task and key, :func:`~celery_extras.admission.notices.bucket_tag`), so keys spread over
a Redis Cluster's masters; every operation is one call of the policy's script (after the
server's time and ``key_holds.lua``), ARGV ``[operation, message id, holder, ...]``. A run
that ends while its key has a message to start publishes the key on the policy's channel.
No Celery import.
"""

from __future__ import annotations

import math
from typing import Any

from ..admission.notices import Bucket, bucket_tag
from ..scripts import register

__all__ = ["RedisKeyHolds", "ms", "text"]


def ms(seconds: float) -> int:
    """*seconds* as whole milliseconds, rounded up, at least one."""
    return max(1, math.ceil(seconds * 1000))


def text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class RedisKeyHolds:
    """The holds of one policy (*kind*: ``coalesce``, ``debounce``) of every key under
    *prefix* in *client*'s Redis (or Cluster), kept by *script*."""

    def __init__(self, client: Any, prefix: str, kind: str, script: str) -> None:
        self.client = client
        self.prefix = prefix
        self.kind = kind
        self.channel = f"{prefix}:{kind}:ended"
        self._script = register(client, script)

    def hash_key(self, name: str, key: str) -> str:
        """The hash of ``(name, key)``, under a hash tag of its own."""
        return f"{self.prefix}:{self.kind}:{bucket_tag(name, key)}"

    def _call(self, bucket: Bucket, *args: Any) -> Any:
        return self._script(keys=[self.hash_key(*bucket)], args=list(args))

    def step_aside(self, bucket: Bucket, mid: str, holder: str, seconds: float,
                   lease: float) -> bool:  # fmt: skip
        """Run *mid* goes on elsewhere: held *seconds* + *lease* for whoever receives it."""
        return bool(self._call(bucket, "aside", mid, holder, ms(seconds + lease)))

    def _park(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
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
