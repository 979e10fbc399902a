"""Where a parked entry lives: the delay store's shards and their hash tags.

Each shard is one hash tag, so its scripts run on one node of a Redis Cluster. A store of
*n* shards (``extras_delay_shards``) spreads its entries over them by a hash of the entry
id; shard *i*'s tag is chosen to fall in the *i*-th *n*-th of the cluster's 16,384 hash
slots, so on a cluster whose slots are split evenly between its masters (as ``redis-cli
--cluster create`` splits them) the shards, and the entries, spread evenly when *n* is a
multiple of the masters. A store of one shard is the store of earlier releases, under the
tag ``{<prefix>:delay}``; with more, that shard is still read (it drains), never written.

A claim token names the shard it was issued by (``<shard>/<token>``; none for the first
shard), so a worker that receives a released message knows where to take it, whatever
the shard count of the worker that parked it. No Celery import.
"""

from __future__ import annotations

import binascii
import functools
import zlib
from dataclasses import dataclass

__all__ = ["MAX_SHARDS", "SLOTS", "Shard", "key_slot", "layout", "shard_named", "shard_of"]

#: Most shards a store may have.
MAX_SHARDS = 256
#: Hash slots of a Redis Cluster.
SLOTS = 16384
_NAMES = ("due", "meta", "msg", "taken", "released", "parked")


def key_slot(tag: str) -> int:
    """The cluster hash slot of a key whose hash tag is *tag* (CRC16-XMODEM, as Redis)."""
    return binascii.crc_hqx(tag.encode(), 0) % SLOTS


@dataclass(frozen=True)
class Shard:
    """One shard: its name (in claim tokens; ``""`` for the first shard) and its keys."""

    name: str
    tag: str

    def key(self, name: str) -> str:
        return f"{{{self.tag}}}:{name}"

    @functools.cached_property
    def keys(self) -> dict[str, str]:
        """``due``, ``meta``, ``msg``, ``taken``, ``released`` and ``parked``, all under the
        tag (built once: every take and claim names them)."""
        return {name: self.key(name) for name in _NAMES}

    def token(self, token: str) -> str:
        """*token* as issued by this shard (carrying the shard's name)."""
        return f"{self.name}/{token}" if self.name else token


def first_shard(prefix: str) -> Shard:
    """The shard of a store of one shard, and of every store before shards."""
    return Shard("", f"{prefix}:delay")


@functools.cache
def layout(prefix: str, count: int) -> tuple[Shard, ...]:
    """The shards of a store of *count* shards under *prefix* (see the module's text)."""
    if count <= 1:
        return (first_shard(prefix),)
    shards = []
    for index in range(count):
        low, high = index * SLOTS // count, (index + 1) * SLOTS // count
        suffix = 0
        while not low <= key_slot(f"{prefix}:delay:{count}.{index}.{suffix}") < high:
            suffix += 1
        shards.append(Shard(f"{count}.{index}", f"{prefix}:delay:{count}.{index}.{suffix}"))
    return tuple(shards)


def shard_of(entry_id: str, shards: tuple[Shard, ...]) -> Shard:
    """The shard among *shards* an entry id is parked in."""
    if len(shards) == 1:
        return shards[0]
    return shards[zlib.crc32(entry_id.encode()) % len(shards)]


def shard_named(prefix: str, token: str) -> Shard | None:
    """The shard that issued claim *token*, or ``None`` when the token names no valid one
    (a forged header)."""
    name, slash, _ = token.partition("/")
    if not slash:
        return first_shard(prefix)
    count_text, dot, index_text = name.partition(".")
    if not (dot and count_text.isdecimal() and index_text.isdecimal()):
        return None
    if len(count_text) > 3 or len(index_text) > 3:
        return None
    count, index = int(count_text), int(index_text)
    if not 1 < count <= MAX_SHARDS or index >= count:
        return None
    return layout(prefix, count)[index]
