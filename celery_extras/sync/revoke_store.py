"""The durable revoke store: revoked task ids and stamps on Redis, each with its own expiry.

The store is split into :data:`SHARDS` shards, so that on a Redis Cluster no
single slot (and no single master) holds every revoke. An id or stamp belongs to
shard ``crc32(member) % SHARDS``. Shard ``n`` keeps its keys under one hash tag,
``{<extras_key_prefix>:sync:<n>}:``, so each script touches one slot only: two
sorted sets ``revoked`` (task id -> expiry, a Unix time) and ``stamps``
(``["header", value]`` JSON -> expiry); a change log ``log`` (``i:<id>`` /
``s:<stamp>`` -> sequence number of its last change) with its counter ``seq``;
an ``epoch`` token; and ``clock``, the highest Lamport clock any writer or reader
has reported to that shard (the store's clock is the highest of the shards').

Every operation is one Lua script per shard, so each shard's writes are atomic; a
write that would not extend an entry's expiry changes nothing (idempotent); each
call trims expired entries and evicts the soonest-expiring beyond its share of
``max_entries``. A worker syncs by comparing the store's
:class:`~.digest.Version` (one per shard, see :func:`~.digest.plan_pull`) with
the one it merged up to and reading only the changes after it.

Earlier versions kept one unsharded set of these keys under
``<extras_key_prefix>:sync:``; a full pull also reads those (:data:`LEGACY_PARTS`),
so revokes written by the previous version are honoured after an upgrade.
"""

from __future__ import annotations

import json
import math
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from ..scripts import load, register
from .digest import Version
from .entries import (
    Parsed,
    Stamp,
    parse_expiring,
    parse_stamp_member,
    stamp_member,
    valid_clock,
)

__all__ = ["LEGACY_PARTS", "SHARDS", "RevokeStore", "Snapshot", "shard_of"]

#: Entries per script call when writing many at once (each call is atomic).
WRITE_CHUNK = 5000
#: How many shards the revokes are spread over (fixed: it decides where an entry lives).
SHARDS = 8
#: The unsharded keys of earlier versions, read on a full pull: ``<prefix>:sync:<part>``.
LEGACY_PARTS = ("revoked", "stamps", "clock")

# Each script's KEYS, ARGV and reply are documented atop its file in celery_extras/scripts/.
#: The prefix of every revoke script (``scripts/revoke_common.lua``): heals a garbage counter
#: or epoch, defines ``trim`` and ``merge_clock``.
_COMMON = load("revoke_common")
#: Store ids and stamps with their expiry (``scripts/revoke_write.lua``).
_WRITE = _COMMON + load("revoke_write")
#: The shard's epoch, seq and clock (``scripts/revoke_probe.lua``).
_PROBE = _COMMON + load("revoke_probe")
#: A page of the entries changed after a seq (``scripts/revoke_pull.lua``).
_PULL = _COMMON + load("revoke_pull")

#: Most changes one pull script returns: a worker holds one page of a pull at a time,
#: so catching up with a full store costs it a page's memory, not the store's.
PULL_PAGE = 2000


@dataclass
class Snapshot:
    """What a pull returned: the version read up to and the store's clock, and the valid
    entries read (a page's version is its shard's: the cursor to read on from)."""

    version: Version
    clock: int
    ids: Parsed
    stamps: Parsed

    @property
    def dropped(self) -> int:
        return self.ids.dropped + self.stamps.dropped


class RevokeStore:
    """Revoked ids and stamps with per-entry expiry, shared by clients and workers."""

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        prefix: str,
        max_entries: int,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.shard_keys = [
            [f"{{{prefix}:sync:{n}}}:{part}" for part in _KEY_PARTS] for n in range(SHARDS)
        ]
        self.legacy_keys = {part: f"{prefix}:sync:{part}" for part in LEGACY_PARTS}
        self.max_entries = max_entries
        self.shard_max = max(1, math.ceil(max_entries / SHARDS))
        self.wall_clock = wall_clock
        self._write = register(client, _WRITE)
        self._probe = register(client, _PROBE)
        self._pull = register(client, _PULL)

    def _argv(self, clock: int) -> list[Any]:
        return [repr(self.wall_clock()), self.shard_max, int(clock), uuid.uuid4().hex]

    def add(
        self,
        ids: Mapping[str, float] | None = None,
        stamps: Mapping[Stamp, float] | None = None,
        clock: int = 0,
    ) -> int:
        """Store *ids* and *stamps* (each -> its expiry, a Unix time); return how many changed.

        Entries already stored with a later expiry are left alone, so writing the
        same revoke twice is harmless. Raises :class:`redis.RedisError` when the
        store cannot be reached (shards written before the error keep their entries).
        """
        by_shard: list[tuple[list[tuple[str, float]], list[tuple[str, float]]]] = [
            ([], []) for _ in range(SHARDS)
        ]
        for task_id, expiry in (ids or {}).items():
            by_shard[shard_of(str(task_id))][0].append((str(task_id), float(expiry)))
        for (header, value), expiry in (stamps or {}).items():
            member = stamp_member(header, value)
            by_shard[shard_of(member)][1].append((member, float(expiry)))
        changed = 0
        for n, (id_items, stamp_items) in enumerate(by_shard):
            if not id_items and not stamp_items and n:
                continue  # shard 0 is always written, so that an empty add still merges the clock
            for id_chunk, stamp_chunk in _chunks(id_items, stamp_items):
                argv = [*self._argv(clock), len(id_chunk)]
                for member, expiry in (*id_chunk, *stamp_chunk):
                    argv += [member, repr(expiry)]
                changed += int(self._write(keys=self.shard_keys[n], args=argv)[0])
        return changed

    def probe(self, clock: int = 0) -> tuple[Version, int]:
        """The store's version and clock (after merging *clock* into it); trims as it goes."""
        versions, clocks = [], []
        for keys in self.shard_keys:
            epoch, seq, stored_clock = self._probe(keys=keys, args=self._argv(clock))
            versions.append(Version(str(epoch), int(seq)))
            clocks.append(int(stored_clock))
        return Version.of_shards(versions), max(clocks)

    def pull(self, after: Version | None = None, clock: int = 0) -> Snapshot:
        """Entries changed after the cursor *after* (``None``: all, the legacy keys too), validated.

        A cursor of another shape than the store's (written by another version) reads all.
        """
        shard_after = [0] * SHARDS
        if after is not None and len(after.shards) == SHARDS:
            shard_after = [shard.seq for shard in after.shards]
        pages = [self.legacy()] if after is None else []
        versions = []
        for n, since in enumerate(shard_after):
            pages += self.pages(n, since, clock)
            versions.append(pages[-1].version)
        ids, stamps = Parsed(), Parsed()
        for page in pages:  # in order: the shards' later expiries win over the legacy keys'
            ids.update(page.ids)
            stamps.update(page.stamps)
        return Snapshot(Version.of_shards(versions), max(p.clock for p in pages), ids, stamps)

    def pages(self, shard: int, after: int = 0, clock: int = 0) -> Iterator[Snapshot]:
        """The entries of *shard* changed after its seq *after* (0: all), a page at a time.

        Each page's version is the shard's epoch and the seq read up to; the last page's
        is the shard's seq, so it is the cursor to compare with the next probe.
        """
        keys = self.shard_keys[shard]
        while True:
            argv = [*self._argv(clock), after, PULL_PAGE]
            epoch, seq, stored_clock, upto, entries = self._pull(keys=keys, args=argv)
            after = int(float(upto))
            ids, stamps = _decode_entries(entries)
            yield _snapshot(
                Version(str(epoch), after), int(stored_clock), ids, stamps, self.wall_clock()
            )
            if after >= int(seq):
                return

    def legacy(self) -> Snapshot:
        """What the previous, unsharded layout holds (read-only: single-key commands)."""
        now = self.wall_clock()
        pipe = self.client.pipeline(transaction=False)
        pipe.zrangebyscore(self.legacy_keys["revoked"], f"({now!r}", "+inf", withscores=True)
        pipe.zrangebyscore(self.legacy_keys["stamps"], f"({now!r}", "+inf", withscores=True)
        pipe.get(self.legacy_keys["clock"])
        ids, stamps, stored_clock = pipe.execute()
        try:
            legacy_clock = int(stored_clock or 0)
        except ValueError:
            legacy_clock = 0
        flat = [[x for pair in pairs for x in pair] for pairs in (ids, stamps)]
        clock = legacy_clock if valid_clock(legacy_clock) else 0
        return _snapshot(Version("", 0), clock, flat[0], flat[1], now)

    def counts(self) -> dict[str, int]:
        """How many ids and stamps the store holds, and its change counter (all shards)."""
        totals = {"ids": 0, "stamps": 0, "seq": 0, "clock": 0}
        for keys in self.shard_keys:
            pipe = self.client.pipeline(transaction=False)
            pipe.zcard(keys[0])
            pipe.zcard(keys[1])
            pipe.get(keys[3])
            pipe.get(keys[4])
            ids, stamps, seq, clock = pipe.execute()
            totals["ids"] += ids
            totals["stamps"] += stamps
            totals["seq"] += int(seq or 0)
            totals["clock"] = max(totals["clock"], int(clock or 0))
        return totals

    def newest(self, limit: int) -> dict[str, Any]:
        """The *limit* ids and stamps expiring last, with their expiry (for listings)."""
        ids: list[tuple[str, float]] = []
        stamps: list[tuple[str, float]] = []
        for keys in self.shard_keys:
            ids += self.client.zrevrange(keys[0], 0, limit - 1, withscores=True)  # type: ignore[arg-type]
            stamps += self.client.zrevrange(keys[1], 0, limit - 1, withscores=True)  # type: ignore[arg-type]
        ids = sorted(ids, key=lambda pair: pair[1], reverse=True)[:limit]
        stamps = sorted(stamps, key=lambda pair: pair[1], reverse=True)[:limit]
        parsed = [(parse_stamp_member(m), e) for m, e in stamps]
        return {
            "newest_ids": dict(ids),
            "newest_stamps": [[s[0], s[1], e] for s, e in parsed if s is not None],
        }


def shard_of(member: str) -> int:
    """The shard of an id, or of a stamp's stored member (stable across versions and hosts)."""
    return zlib.crc32(member.encode("utf-8", "surrogatepass")) % SHARDS


def _snapshot(
    version: Version, clock: int, ids: list[Any], stamps: list[Any], now: float
) -> Snapshot:
    """A snapshot of flat ``[member, expiry, ...]`` lists, validated (expired entries skipped)."""
    stamp_pairs = zip(stamps[::2], stamps[1::2], strict=True)
    return Snapshot(
        version,
        clock,
        parse_expiring(zip(ids[::2], ids[1::2], strict=True), now),
        parse_expiring([(parse_stamp_member(m) or m, e) for m, e in stamp_pairs], now, stamps=True),
    )


def _decode_entries(text: str) -> tuple[list[Any], list[Any]]:
    """The ``[ids, stamps]`` flat member/expiry lists the pull script encodes as JSON.

    Lua's cjson encodes an empty table as ``{}``; that reads back as no entries.
    """
    decoded = json.loads(text)
    ids, stamps = decoded if isinstance(decoded, list) and len(decoded) == 2 else ([], [])
    return (ids if isinstance(ids, list) else []), (stamps if isinstance(stamps, list) else [])


_KEY_PARTS = ("revoked", "stamps", "log", "seq", "clock", "epoch")


def _chunks(
    ids: list[tuple[str, float]], stamps: list[tuple[str, float]]
) -> Iterator[tuple[list[tuple[str, float]], list[tuple[str, float]]]]:
    """Split a write into script calls of at most :data:`WRITE_CHUNK` entries (at least one)."""
    yield ids[:WRITE_CHUNK], stamps[:WRITE_CHUNK]
    i, s = WRITE_CHUNK, WRITE_CHUNK
    while i < len(ids) or s < len(stamps):
        yield ids[i : i + WRITE_CHUNK], stamps[s : s + WRITE_CHUNK]
        i += WRITE_CHUNK
        s += WRITE_CHUNK
