"""The cheap digest of the durable revoke store, and what a worker must pull to catch up.

The store stamps every change with a sequence number, under an *epoch* token
that changes when the store is emptied (a new Redis, keys deleted). A worker
remembers the ``(epoch, seq)`` it has merged up to; comparing it with the
store's current one decides, without reading any entry, whether to pull
nothing, only the changes after its cursor, or everything. A sharded store has
one such version per shard; the store's version then lists them, and any shard
that went back (another epoch, a lower seq: a failover lost its last writes)
means everything. No Celery import.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Pull", "Version", "plan_pull"]


@dataclass(frozen=True)
class Version:
    """Where the store (or a worker's copy of it) stands: its epoch token and last change."""

    epoch: str
    seq: int
    #: One version per shard of a sharded store (``epoch`` and ``seq`` then sum them up).
    shards: tuple[Version, ...] = ()

    @classmethod
    def of_shards(cls, shards: list[Version]) -> Version:
        return cls(
            ",".join(shard.epoch for shard in shards), sum(s.seq for s in shards), tuple(shards)
        )


class Pull(enum.Enum):
    """What to read from the store to catch up."""

    NOTHING = "nothing"
    CHANGES = "changes"  # entries changed after the cursor's seq
    EVERYTHING = "everything"


def plan_pull(cursor: Version | None, store: Version) -> Pull:
    """Compare the worker's *cursor* with the *store*'s version.

    A missing cursor (first sync), another epoch, or a seq behind the cursor
    (the store lost changes) means everything; a seq ahead means the changes.
    """
    if cursor is None or cursor.epoch != store.epoch or store.seq < cursor.seq:
        return Pull.EVERYTHING
    if len(cursor.shards) != len(store.shards):
        return Pull.EVERYTHING
    pairs = zip(cursor.shards, store.shards, strict=True)
    plans = {plan_pull(mine, theirs) for mine, theirs in pairs}
    if Pull.EVERYTHING in plans:
        return Pull.EVERYTHING
    if store.seq > cursor.seq or Pull.CHANGES in plans:
        return Pull.CHANGES
    return Pull.NOTHING
