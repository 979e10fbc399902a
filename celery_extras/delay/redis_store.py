"""The delay store on Redis: the rules of :mod:`.store` as atomic Lua scripts.

Each shard (:mod:`.shards`) has six keys under its own hash tag, so every script runs on
one node of a Redis Cluster (the first shard's tag is ``{<prefix>:delay}``):

* ``due``: sorted set, entry id -> when a mover should next look at it, in milliseconds
  of the *Redis server's* clock (``TIME``): its due time while parked, the end of its
  lease while claimed, its re-check time once released;
* ``meta``: hash, entry id -> small JSON (task id, name, kind, due time, claim tokens
  issued, the token that took it);
* ``msg``: hash, entry id -> the whole message (:class:`.entry.Entry` JSON), deleted when
  the entry is taken;
* ``taken``: sorted set, entry id -> when it was taken, for pruning tombstones after
  ``tombstone_ttl``;
* ``released``: sorted set, entry id -> when it was published, until a worker takes it
  (how far the workers are behind: movers publish a herd ahead only while they keep up);
* ``parked``: hash, queue -> entries not yet taken that record it (``scripts/delay_parked.lua``
  keeps it: the scripts that park and remove an entry count it up and down in the same call),
  so the queue figures read what the store holds per queue in one ``HGETALL`` per shard.

Every time is read from the server, so workers whose clocks disagree agree on
when an entry is due; results are returned as seconds from now. No Celery import.

A park is refused when the store is at its ``maxmemory`` (``OOM command not
allowed``: the caller keeps the message), but claiming, releasing and taking run
even then (Redis 7's ``allow-oom`` script flag): they write a few bytes and taking
frees a whole message, so a store that parks filled drains itself.

With *replicas* > 0, :meth:`RedisDelayStore.park` is durable across a failover: the
park script and ``WAIT replicas timeout`` go in one round trip on one connection,
and a park no replica acknowledged in time is withdrawn and reported as
:class:`ParkNotReplicated`, so the caller keeps the message (see docs/store.rst).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from typing import Any, cast

import redis
from redis.exceptions import NoScriptError, RedisClusterException

from ..scripts import NOW, load, register
from ..store.client import LazyCluster, StoreClient
from .entry import Entry
from .shards import MAX_SHARDS, Shard, first_shard, layout, shard_named, shard_of
from .store import (
    MAX_TOKENS,
    PURGED_MARK,
    Claim,
    Claimed,
    Purged,
    Selection,
    Taken,
    TakeStatus,
    TaskSummary,
)  # fmt: skip

__all__ = ["PURGE_PAGE", "ParkNotReplicated", "RedisDelayStore", "delay_keys", "entry_fates"]

logger = logging.getLogger(__name__)

# Each script's KEYS, ARGV and reply are documented atop its file in celery_extras/scripts/.
#: Every timed script starts with the Redis server's time in ms (``scripts/now_ms.lua``).
#: Store an entry unless known (``scripts/delay_park.lua``).
PARK = NOW + load("delay_parked") + load("delay_park")
#: Claim the entries due within a lead, and prune old tombstones (``scripts/delay_claim.lua``).
#: This and the next two run through :class:`_DrainingScript` (the ``allow-oom`` flag line
#: goes first, before this text).
CLAIM = NOW + load("delay_parked") + load("delay_claim")
#: Put a claimed entry back for a re-check (``scripts/delay_release.lua``).
RELEASE = NOW + load("delay_release")
#: Take an entry with a claim token, once (``scripts/delay_take.lua``).
TAKE = NOW + load("delay_parked") + load("delay_take")


#: The flag of the scripts that must run on a store at its ``maxmemory`` (Redis >= 7).
ALLOW_OOM = "#!lua flags=allow-oom\n"


class _DrainingScript:
    """A script flagged ``allow-oom``, or unflagged on a Redis older than 7.0, which cannot
    compile the flag (there, as before, a store at its ``maxmemory`` cannot release)."""

    def __init__(self, client: StoreClient, body: str) -> None:
        self._client = client
        self._body = body
        self._script = register(client, ALLOW_OOM + body)
        self._flagged = True

    def __call__(self, keys: list[str], args: list[Any]) -> Any:
        try:
            return self._script(keys=keys, args=args)
        except redis.ResponseError as exc:
            if not (self._flagged and "compiling script" in str(exc).lower()):
                raise
            self._flagged = False
            self._script = register(self._client, self._body)
            return self._script(keys=keys, args=args)


def delay_keys(prefix: str) -> dict[str, str]:
    """The keys of the store's first shard under *prefix* (a store of one shard)."""
    return first_shard(prefix).keys


#: Seconds between two reads of the shard counts the store's workers use.
LAYOUTS_REFRESH = 30.0


#: Drop an entry whatever its state (``scripts/delay_discard.lua``). A script, not MULTI: one
#: call on any Redis, Cluster included (redis-py 5's cluster client has no transactions).
DISCARD = load("delay_parked") + load("delay_discard")


#: Make a parked entry due now (``scripts/delay_hurry.lua``).
HURRY = NOW + load("delay_hurry")


#: Take back a park no replica acknowledged, unless claimed or taken meanwhile
#: (``scripts/delay_withdraw.lua``).
WITHDRAW = load("delay_parked") + load("delay_withdraw")


#: Drop the entries of one page of a shard that a selection names (``scripts/delay_purge.lua``);
#: flagged ``allow-oom`` (:class:`_DrainingScript`): purging is how a full store is emptied.
PURGE = NOW + load("delay_parked") + load("delay_purge")

#: Entries a purge script call looks at (``HSCAN ... COUNT``): each call is atomic and short
#: (a few ms), so a purge of a million entries never stops the store's Redis for long.
PURGE_PAGE = 500


def _whole_ms(seconds: float) -> int:
    """*seconds* in whole ms, never short of it (a parked wait never ends early) but for a
    float's last digits (0.1 - 0.0999... is 0, not 1 ms)."""
    return math.ceil(seconds * 1000 - 1e-6)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _counts(raw: dict[Any, Any], shard: str, logged: set[tuple[str, str]]) -> dict[str, int]:
    """A shard's ``parked`` hash as counts. A count that is not an integer >= 1 (the scripts
    never leave one) is read as none, and logged once per shard and queue (*logged*)."""
    out: dict[str, int] = {}
    for key, value in raw.items():
        queue, text = _text(key), _text(value)
        if text.isdecimal() and int(text) >= 1:
            out[queue] = int(text)
        elif (shard, queue) not in logged:
            logged.add((shard, queue))
            logger.warning("celery-extras: the delay store's parked count of queue %r in "
                           "shard %r is %r, not a count: read as 0", queue[:200], shard,
                           text[:50])  # fmt: skip
    return out


def _fate(meta: str | bytes) -> bool | None:
    """An entry's meta read: purged ``True``, not yet taken ``False``, taken ``None``."""
    try:
        mark = json.loads(_text(meta)).get("x")
    except (ValueError, AttributeError):
        return None
    return True if mark == PURGED_MARK else (False if mark is None else None)


def entry_fates(client: StoreClient, shards: Iterable[Shard],
                entry_ids: list[str]) -> dict[str, bool | None]:  # fmt: skip
    """:meth:`RedisDelayStore.purged`: one ``HMGET`` of each shard's meta hash, until each id
    is found (a tombstone's ``x`` is :data:`~.store.PURGED_MARK`, else a claim token)."""
    fates: dict[str, bool | None] = dict.fromkeys(entry_ids)
    left = list(entry_ids)
    for shard in shards:
        if not left:
            break
        metas = cast("list[Any]", client.hmget(shard.key("meta"), left))
        for entry_id, meta in zip(left, metas, strict=True):
            if meta is not None:
                fates[entry_id] = _fate(meta)
        left = [entry_id for entry_id, meta in zip(left, metas, strict=True) if meta is None]
    return fates


class ParkNotReplicated(redis.RedisError):
    """Fewer replicas than asked acknowledged a park within the wait; it was withdrawn."""


class RedisDelayStore:
    """:class:`~.store.DelayStore` on *client*'s Redis, keys under *prefix*, entries spread
    over *shards* shards (:mod:`.shards`)."""

    def __init__(
        self,
        client: StoreClient,
        prefix: str,
        tombstone_ttl: float = 86400.0,
        *,
        replicas: int = 0,
        replica_wait: float = 1.0,
        shards: int = 1,
    ) -> None:
        self.client = client
        self.prefix = prefix
        #: the shards this store parks in
        self.layout = layout(prefix, shards)
        #: the shard counts every worker of the store uses, registered under the first shard
        self.layouts_key = first_shard(prefix).key("layouts")
        self.tombstone_ttl = tombstone_ttl
        #: replicas that must acknowledge a park (``WAIT``) before it counts; 0: no ``WAIT``
        self.replicas = replicas
        self.replica_wait = replica_wait
        self._park = register(client, PARK)
        self._withdraw = register(client, WITHDRAW)
        self._claim = _DrainingScript(client, CLAIM)
        self._release = _DrainingScript(client, RELEASE)
        self._take = _DrainingScript(client, TAKE)
        self._discard = register(client, DISCARD)
        self._hurry = register(client, HURRY)
        self._purge = _DrainingScript(client, PURGE)
        self._registered = len(self.layout) == 1
        self._known: tuple[Shard, ...] = (first_shard(prefix), *self.layout)
        self._known_at = -math.inf
        self._turn = 0
        self._bad_counts: set[tuple[str, str]] = set()  # (shard, queue) logged once

    def shards(self) -> tuple[Shard, ...]:
        """Every shard that may hold entries: the first (earlier releases parked there),
        this store's and those of every shard count a worker of the store parks with."""
        now = time.monotonic()
        if now - self._known_at >= LAYOUTS_REFRESH:
            counts = sorted(
                int(c) for c in self.client.smembers(self.layouts_key)
                if str(c).isdecimal() and 1 < int(c) <= MAX_SHARDS
            )  # fmt: skip
            found = [first_shard(self.prefix), *self.layout]
            found += [shard for count in counts for shard in layout(self.prefix, count)]
            self._known = tuple(dict.fromkeys(found))
            self._known_at = now
        return self._known

    def park(self, entry_id: str, entry: Entry, delay: float) -> bool:
        """Store *entry*; ``False`` if known already. With :attr:`replicas`, only once that
        many replicas acknowledged it, else :class:`ParkNotReplicated` (entry withdrawn)."""
        if not self._registered:  # movers of a store of fewer shards read these too
            self.client.sadd(self.layouts_key, len(self.layout))
            self._registered = True
        delay_ms = max(0, min(_whole_ms(delay), 10 * 365 * 86400 * 1000))
        k = shard_of(entry_id, self.layout).keys
        keys = [k["due"], k["meta"], k["msg"], k["parked"]]
        args: list[str | int] = [entry_id, delay_ms, json.dumps(entry.meta()), entry.dumps()]
        if self.replicas <= 0:
            return bool(self._park(keys=keys, args=args))
        new, acked = self._park_and_wait(keys, args)
        if acked >= self.replicas:
            return new
        if self._withdraw(keys=keys, args=[entry_id]):
            raise ParkNotReplicated(
                f"{acked} of {self.replicas} replica(s) acknowledged the park within "
                f"{self.replica_wait:g} s (WAIT); the entry was withdrawn"
            )
        return new  # a mover claimed it meanwhile: a copy may be out, so the park stands

    def _park_and_wait(self, keys: list[str], args: list[str | int]) -> tuple[bool, int]:
        """The park script then ``WAIT``, pipelined on one connection (``WAIT`` counts the
        replicas that acknowledged this connection's writes); on a cluster the ``WAIT`` goes
        to the node that holds the keys. ``(parked anew, replicas that acknowledged)``."""
        client: Any = self.client
        cluster = isinstance(client, LazyCluster | redis.RedisCluster)
        wait = ("WAIT", self.replicas, max(1, int(self.replica_wait * 1000)))
        for attempt in (1, 2):
            try:
                pipe = client.pipeline(transaction=False)
                pipe.execute_command("EVALSHA", self._park.sha, len(keys), *keys,
                                     *self._park.args(args))  # fmt: skip
                if cluster:
                    pipe.execute_command(*wait, target_nodes=client.get_node_from_key(keys[0]))
                else:
                    pipe.execute_command(*wait)
                parked, acked = pipe.execute(raise_on_error=False)
            except RedisClusterException as exc:
                raise redis.ConnectionError(f"Redis Cluster: {exc}") from exc
            if isinstance(parked, NoScriptError) and attempt == 1:
                client.script_load(PARK)  # a fresh server (restart, failover): load, again
                continue
            for result in (parked, acked):
                if isinstance(result, Exception):
                    raise result
            break
        return bool(parked), int(acked)

    def _by_id(self, entry_id: str) -> list[Shard]:
        """The shards an entry may be in: where this store parks it first."""
        home = shard_of(entry_id, self.layout)
        return [home, *(s for s in self.shards() if s != home)]

    def hurry(self, entry_id: str) -> bool:
        """Make a parked entry due now; ``False`` when unknown or already on its way."""
        for shard in self._by_id(entry_id):
            k = shard.keys
            found = int(self._hurry(keys=[k["due"], k["meta"]], args=[entry_id]))
            if found:  # 1: due now; 2: on its way (no other shard holds it)
                return found == 1
        return False

    def claim(
        self, lead: float, lease: float, tokens: list[str], lookahead: float = 0.0,
        window: int = 0, pace: float = 0.0,
    ) -> Claimed:  # fmt: skip
        """Claim up to ``len(tokens)`` entries, shard after shard (each mover starting at
        another one); see ``scripts/delay_claim.lua``."""
        shards = self.shards()
        start = self._turn % len(shards)
        self._turn += 1
        items: list[Claim] = []
        next_in: float | None = None
        fixed = [int(lead * 1000), int(lease * 1000), int(self.tombstone_ttl * 1000),
                 MAX_TOKENS, int(lookahead * 1000), window, pace]  # fmt: skip
        for shard in shards[start:] + shards[:start]:
            left = tokens[len(items) :]
            if not left:
                break
            k = shard.keys
            reply = cast("list[Any]", self._claim(
                keys=[k["due"], k["meta"], k["msg"], k["taken"], k["released"], k["parked"]],
                args=[*fixed, *(shard.token(t) for t in left)],
            ))  # fmt: skip
            next_ms = int(reply[0])
            if next_ms >= 0:
                next_in = next_ms / 1000 if next_in is None else min(next_in, next_ms / 1000)
            items += [
                Claim(entry_id=str(reply[i]), token=str(reply[i + 1]),
                      attempt=int(reply[i + 2]), raw=str(reply[i + 3]),
                      due_in=int(reply[i + 4]) / 1000)
                for i in range(1, len(reply), 5)
            ]  # fmt: skip
        return Claimed(items, next_in)

    def release(self, entry_id: str, token: str, recheck: float) -> bool:
        return self.release_all([(entry_id, token)], recheck) == 1

    def release_all(self, published: Iterable[tuple[str, str]], recheck: float) -> int:
        """Record that each ``(entry id, claim token)`` was published: one script call per
        shard. How many were recorded."""
        by_shard: dict[Shard, list[str]] = {}
        for entry_id, token in published:
            shard = shard_named(self.prefix, token)
            if shard is not None:
                by_shard.setdefault(shard, []).extend((entry_id, token))
        recorded = 0
        for shard, pairs in by_shard.items():
            k = shard.keys
            recorded += int(self._release(keys=[k["due"], k["meta"], k["released"]],
                                          args=[int(recheck * 1000), *pairs]))  # fmt: skip
        return recorded

    def take(self, entry_id: str, task_id: str, token: str) -> Taken:
        shard = shard_named(self.prefix, token)
        if shard is None:  # a token no shard issued (a forged header)
            return Taken(TakeStatus.UNKNOWN)
        k = shard.keys
        reply = cast("list[Any]", self._take(
            keys=[k["due"], k["meta"], k["msg"], k["taken"], k["released"], k["parked"]],
            args=[entry_id, task_id, token],
        ))  # fmt: skip
        return Taken(TakeStatus(int(reply[0])), int(reply[1]) / 1000, str(reply[2]))

    def discard(self, entry_id: str) -> None:
        for shard in self._by_id(entry_id):
            k = shard.keys
            self._discard(keys=[k["due"], k["meta"], k["msg"], k["released"], k["parked"]],
                          args=[entry_id])  # fmt: skip

    def depth(self) -> int:
        """Entries not yet taken (parked, claimed or released, waiting for a worker)."""
        return sum(self.shard_depths().values())

    def shard_depths(self) -> dict[str, int]:
        """Entries not yet taken, per shard (by name; the first shard is ``"0"``)."""
        return {shard.name or "0": int(self.client.zcard(shard.key("due")))
                for shard in self.shards()}  # fmt: skip

    def parked_by_queue(self) -> dict[str, int]:
        """Entries not yet taken per queue they count for (:meth:`.Entry.counted_queue`):
        one ``HGETALL`` of each shard's ``parked`` hash, never a walk of the entries."""
        out: dict[str, int] = {}
        for shard in self.shards():
            raw = self.client.hgetall(shard.key("parked"))
            for queue, n in _counts(raw, shard.name or "0", self._bad_counts).items():
                out[queue] = out.get(queue, 0) + n
        return out

    def summary(self) -> dict[str, TaskSummary]:
        """Walks the meta hashes (for the CLI; not on any task's path)."""
        now_s, now_us = self.client.time()
        now = now_s * 1000 + now_us // 1000
        out: dict[str, TaskSummary] = {}
        for shard in self.shards():
            for _entry_id, raw in self.client.hscan_iter(shard.key("meta"), count=1000):
                try:
                    meta = json.loads(raw)
                    if meta.get("x"):
                        continue
                    name, due = str(meta["n"]), int(meta["d"])
                except (ValueError, TypeError, KeyError, AttributeError):
                    continue
                entry = out.setdefault(name, TaskSummary())
                entry.parked += 1
                due_in = (due - now) / 1000
                entry.next_in = due_in if entry.next_in is None else min(entry.next_in, due_in)
        return out

    def purged(self, entry_ids: Iterable[str]) -> dict[str, bool | None]:
        """Of *entry_ids*: purged ``True``, not yet taken ``False``, taken or unknown ``None``."""
        return entry_fates(self.client, self.shards(), list(entry_ids))

    def purge(self, selection: Selection, page: int = PURGE_PAGE) -> Purged:
        """Drop what *selection* names in every shard (:meth:`shards`: this layout's, the
        first and every layout registered), a page of about *page* entries per script call:
        each call is atomic, and a shard of no more than *page* entries is purged in one.
        Paging by ``HSCAN`` visits every entry present from the first call to the last. A
        call the client retries after losing its reply runs its page again: what the first
        run dropped is not found again, so the count may then fall short, never the purge."""
        purged = Purged()
        payload = selection.dumps()
        for shard in self.shards():
            k = shard.keys
            keys = [k["due"], k["meta"], k["msg"], k["taken"], k["released"], k["parked"]]
            cursor = "0"
            while True:
                reply = cast("list[Any]", self._purge(keys=keys, args=[cursor, page, payload]))
                purged += Purged(int(reply[1]), int(reply[2]), int(reply[3]))
                cursor = str(reply[0])
                if cursor == "0":
                    break
        return purged
