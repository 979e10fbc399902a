"""The durable revoke store: revoked task ids and stamps on Redis, each with its own expiry.

Layout under ``<extras_key_prefix>:sync:``: two sorted sets ``revoked`` (task id
-> expiry, a Unix time) and ``stamps`` (``["header", value]`` JSON -> expiry); a
change log ``log`` (``i:<id>`` / ``s:<stamp>`` -> sequence number of its last
change) with its counter ``seq``; an ``epoch`` token; and ``clock``, the
highest Lamport clock any writer or reader has reported.

Every operation is one Lua script, so writes are atomic; a write that would not
extend an entry's expiry changes nothing (idempotent); each call trims expired
entries and evicts the soonest-expiring beyond ``max_entries``. A worker syncs by
comparing the store's :class:`~.digest.Version` with the one it merged up to and
reading only the changes after it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from .digest import Version
from .entries import Parsed, Stamp, parse_expiring, parse_stamp_member, stamp_member

__all__ = ["RevokeStore", "Snapshot"]

#: Entries per script call when writing many at once (each call is atomic).
WRITE_CHUNK = 5000

_COMMON = """
local now = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
redis.call('SET', KEYS[6], ARGV[4], 'NX')
local function trim(key, tag)
  local gone = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, 10000)
  for _, member in ipairs(gone) do
    redis.call('ZREM', key, member)
    redis.call('ZREM', KEYS[3], tag .. member)
  end
  local extra = redis.call('ZCARD', key) - max
  if extra > 0 then
    local popped = redis.call('ZPOPMIN', key, extra)
    for j = 1, #popped, 2 do redis.call('ZREM', KEYS[3], tag .. popped[j]) end
  end
end
local function merge_clock()
  local stored = redis.call('GET', KEYS[5])
  if (not stored) or tonumber(stored) < tonumber(ARGV[3]) then
    redis.call('SET', KEYS[5], ARGV[3])
    return ARGV[3]
  end
  return stored
end
"""

# KEYS: revoked stamps log seq clock epoch
# ARGV: now max clock new_epoch n_ids (id expiry)*n_ids (stamp expiry)*
_WRITE = (
    _COMMON
    + """
local changed = 0
local function put(key, tag, member, expiry)
  local old = redis.call('ZSCORE', key, member)
  if tonumber(expiry) > now and ((not old) or tonumber(old) < tonumber(expiry)) then
    redis.call('ZADD', key, expiry, member)
    local seq = redis.call('INCR', KEYS[4])
    redis.call('ZADD', KEYS[3], seq, tag .. member)
    changed = changed + 1
  end
end
local n_ids = tonumber(ARGV[5])
local i = 6
for _ = 1, n_ids do put(KEYS[1], 'i:', ARGV[i], ARGV[i + 1]); i = i + 2 end
while i < #ARGV do put(KEYS[2], 's:', ARGV[i], ARGV[i + 1]); i = i + 2 end
trim(KEYS[1], 'i:')
trim(KEYS[2], 's:')
return {changed, redis.call('GET', KEYS[4]) or '0', merge_clock()}
"""
)

# ARGV: now max clock new_epoch
_PROBE = (
    _COMMON
    + """
trim(KEYS[1], 'i:')
trim(KEYS[2], 's:')
return {redis.call('GET', KEYS[6]), redis.call('GET', KEYS[4]) or '0', merge_clock()}
"""
)

# ARGV: now max clock new_epoch after_seq
_PULL = (
    _COMMON
    + """
local out = {redis.call('GET', KEYS[6]), redis.call('GET', KEYS[4]) or '0', merge_clock()}
if tonumber(ARGV[5]) < 0 then
  table.insert(out, cjson.encode({
    redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES'),
    redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[1], '+inf', 'WITHSCORES')}))
  return out
end
local ids, stamps = {}, {}
local changed = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[5], '+inf')
for _, tagged in ipairs(changed) do
  local member = string.sub(tagged, 3)
  local key, into = KEYS[1], ids
  if string.sub(tagged, 1, 2) == 's:' then key, into = KEYS[2], stamps end
  local expiry = redis.call('ZSCORE', key, member)
  if expiry and tonumber(expiry) > now then
    table.insert(into, member)
    table.insert(into, expiry)
  end
end
table.insert(out, cjson.encode({ids, stamps}))
return out
"""
)


@dataclass
class Snapshot:
    """What a pull returned: the store's version and clock, and the valid entries read."""

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
        client: redis.Redis,
        prefix: str,
        max_entries: int,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.keys = [f"{prefix}:sync:{part}" for part in _KEY_PARTS]
        self.max_entries = max_entries
        self.wall_clock = wall_clock
        self._write = client.register_script(_WRITE)
        self._probe = client.register_script(_PROBE)
        self._pull = client.register_script(_PULL)

    def _argv(self, clock: int) -> list[Any]:
        return [repr(self.wall_clock()), self.max_entries, int(clock), uuid.uuid4().hex]

    def add(
        self,
        ids: Mapping[str, float] | None = None,
        stamps: Mapping[Stamp, float] | None = None,
        clock: int = 0,
    ) -> int:
        """Store *ids* and *stamps* (each -> its expiry, a Unix time); return how many changed.

        Entries already stored with a later expiry are left alone, so writing the
        same revoke twice is harmless. Raises :class:`redis.RedisError` when the
        store cannot be reached.
        """
        id_items = [(i, float(e)) for i, e in (ids or {}).items()]
        stamp_items = [(stamp_member(h, v), float(e)) for (h, v), e in (stamps or {}).items()]
        changed = 0
        for id_chunk, stamp_chunk in _chunks(id_items, stamp_items):
            argv = [*self._argv(clock), len(id_chunk)]
            for member, expiry in (*id_chunk, *stamp_chunk):
                argv += [member, repr(expiry)]
            changed += int(self._write(keys=self.keys, args=argv)[0])
        return changed

    def probe(self, clock: int = 0) -> tuple[Version, int]:
        """The store's version and clock (after merging *clock* into it); trims as it goes."""
        epoch, seq, stored_clock = self._probe(keys=self.keys, args=self._argv(clock))
        return Version(str(epoch), int(seq)), int(stored_clock)

    def pull(self, after: int = -1, clock: int = 0) -> Snapshot:
        """Entries changed after sequence number *after* (``-1``: all), validated."""
        now = self.wall_clock()
        reply = self._pull(keys=self.keys, args=[*self._argv(clock), int(after)])
        epoch, seq, stored_clock, entries = reply
        ids, stamps = _decode_entries(entries)
        stamp_pairs = [
            (parse_stamp_member(m) or m, e) for m, e in zip(stamps[::2], stamps[1::2], strict=True)
        ]
        return Snapshot(
            Version(str(epoch), int(seq)),
            int(stored_clock),
            parse_expiring(zip(ids[::2], ids[1::2], strict=True), now),
            parse_expiring(stamp_pairs, now, stamps=True),
        )

    def counts(self) -> dict[str, int]:
        """How many ids and stamps the store holds, and its change counter."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys[0])
        pipe.zcard(self.keys[1])
        pipe.get(self.keys[3])
        pipe.get(self.keys[4])
        ids, stamps, seq, clock = pipe.execute()
        return {"ids": ids, "stamps": stamps, "seq": int(seq or 0), "clock": int(clock or 0)}

    def newest(self, limit: int) -> dict[str, Any]:
        """The *limit* ids and stamps expiring last, with their expiry (for listings)."""
        ids: list[tuple[str, float]] = self.client.zrevrange(  # type: ignore[assignment]
            self.keys[0], 0, limit - 1, withscores=True
        )
        stamps: list[tuple[str, float]] = self.client.zrevrange(  # type: ignore[assignment]
            self.keys[1], 0, limit - 1, withscores=True
        )
        parsed = [(parse_stamp_member(m), e) for m, e in stamps]
        return {
            "newest_ids": dict(ids),
            "newest_stamps": [[s[0], s[1], e] for s, e in parsed if s is not None],
        }


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
