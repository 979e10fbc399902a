"""The delay store on Redis: the rules of :mod:`.core` as atomic Lua scripts.

Four keys, all under one hash tag (``{<prefix>:delay}``) so every script runs on
one node of a Redis Cluster:

* ``{P:delay}:due``: sorted set, entry id -> when a mover should next look at it,
  in milliseconds of the *Redis server's* clock (``TIME``): its due time while
  parked, the end of its lease while claimed, its re-check time once released;
* ``{P:delay}:meta``: hash, entry id -> small JSON (task id, name, kind, due
  time, claim tokens issued, the token that took it);
* ``{P:delay}:msg``: hash, entry id -> the whole message (:class:`.entry.Entry`
  JSON), deleted when the entry is taken;
* ``{P:delay}:taken``: sorted set, entry id -> when it was taken, for pruning
  tombstones after ``tombstone_ttl``.

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
from typing import Any, cast

import redis
from redis.exceptions import NoScriptError, RedisClusterException

from ..store import LazyCluster, StoreClient
from .core import MAX_TOKENS, Claim, Claimed, Take, Taken, TaskSummary
from .entry import Entry

__all__ = ["ParkNotReplicated", "RedisDelayStore", "delay_keys"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: KEYS: due, meta, msg. ARGV: id, delay ms, meta JSON, entry JSON. Returns 1 parked, 0 known.
#: A known entry's meta is written again, unchanged: every park then propagates a write, so a
#: ``WAIT`` after it covers the entry whichever connection first wrote it.
PARK = (
    _NOW
    + """
local known = redis.call('HGET', KEYS[2], ARGV[1])
if known then
  redis.call('HSET', KEYS[2], ARGV[1], known)
  return 0
end
local m = cjson.decode(ARGV[3])
m.d = now + tonumber(ARGV[2])
m.c = nil
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(m))
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[1], m.d, ARGV[1])
return 1
"""
)

#: KEYS: due, meta, msg, taken. ARGV: lead ms, lease ms, tombstone ttl ms, max tokens, tokens...
#: Returns {next due in ms or -1 when empty, id, token, attempt, raw, due in ms, ...}.
CLAIM = (
    _NOW
    + """
local lead, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local max_tokens = tonumber(ARGV[4])
local limit = #ARGV - 4
local out = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now + lead, 'LIMIT', 0, limit)
local n = 0
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[2], id)
  local msg = redis.call('HGET', KEYS[3], id)
  local ok, m = false, nil
  if raw then ok, m = pcall(cjson.decode, raw) end
  if not ok or type(m) ~= 'table' or m.x or not msg then
    redis.call('ZREM', KEYS[1], id)
    if not (ok and type(m) == 'table' and m.x) then
      redis.call('HDEL', KEYS[2], id)
      redis.call('HDEL', KEYS[3], id)
    end
  else
    n = n + 1
    local token = ARGV[4 + n]
    local tokens = m.c or {}
    table.insert(tokens, token)
    while #tokens > max_tokens do table.remove(tokens, 1) end
    m.c = tokens
    redis.call('HSET', KEYS[2], id, cjson.encode(m))
    redis.call('ZADD', KEYS[1], now + lease, id)
    local due = tonumber(m.d) or now
    table.insert(out, id)
    table.insert(out, token)
    table.insert(out, #tokens)
    table.insert(out, msg)
    table.insert(out, due - now)
  end
end
local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, 200)
for _, id in ipairs(old) do
  redis.call('ZREM', KEYS[4], id)
  redis.call('HDEL', KEYS[2], id)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_in = -1
if first[2] then next_in = math.max(0, tonumber(first[2]) - now) end
table.insert(out, 1, next_in)
return out
"""
)

#: KEYS: due, meta. ARGV: id, token, recheck ms. Returns 1 when the release was recorded.
RELEASE = (
    _NOW
    + """
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
local ok, m = pcall(cjson.decode, raw)
if not ok or type(m) ~= 'table' or m.x or type(m.c) ~= 'table' or m.c[#m.c] ~= ARGV[2] then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
return 1
"""
)

#: KEYS: due, meta, msg, taken. ARGV: id, task id, token.
#: Returns {status, due in ms, kind}: status 0 unknown, 1 taken, 2 redelivered, 3 duplicate.
TAKE = (
    _NOW
    + """
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return {0, 0, ''} end
local ok, m = pcall(cjson.decode, raw)
if not ok or type(m) ~= 'table' or m.t ~= ARGV[2] or type(m.c) ~= 'table' then
  return {0, 0, ''}
end
local issued = false
for _, token in ipairs(m.c) do if token == ARGV[3] then issued = true end end
if not issued then return {0, 0, ''} end
local due_in = (tonumber(m.d) or now) - now
local kind = tostring(m.k or '')
if m.x then
  if m.x == ARGV[3] then return {2, due_in, kind} end
  return {3, due_in, kind}
end
m.x = ARGV[3]
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(m))
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[4], now, ARGV[1])
return {1, due_in, kind}
"""
)


#: The flag of the scripts that must run on a store at its ``maxmemory`` (Redis >= 7).
ALLOW_OOM = "#!lua flags=allow-oom\n"


class _DrainingScript:
    """A script flagged ``allow-oom``, or unflagged on a Redis older than 7.0, which cannot
    compile the flag (there, as before, a store at its ``maxmemory`` cannot release)."""

    def __init__(self, client: StoreClient, body: str) -> None:
        self._client = client
        self._body = body
        self._script = client.register_script(ALLOW_OOM + body)
        self._flagged = True

    def __call__(self, keys: list[str], args: list[Any]) -> Any:
        try:
            return self._script(keys=keys, args=args)
        except redis.ResponseError as exc:
            if not (self._flagged and "compiling script" in str(exc).lower()):
                raise
            self._flagged = False
            self._script = self._client.register_script(self._body)
            return self._script(keys=keys, args=args)


def delay_keys(prefix: str) -> dict[str, str]:
    """The store's keys under *prefix*, all in one hash tag."""
    tag = "{" + prefix + ":delay}"
    return {name: f"{tag}:{name}" for name in ("due", "meta", "msg", "taken")}


#: Drop an entry whatever its state (KEYS: due, meta, msg). A script, not MULTI: one call on
#: any Redis, Cluster included (redis-py 5's cluster client has no transactions).
DISCARD = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"""


#: Take back a park no replica acknowledged (KEYS: due, meta, msg; ARGV: id). Returns 1 when
#: the entry is gone (withdrawn, or never there), 0 when a mover claimed it or a worker took it
#: meanwhile: a copy may be published already, so the park stands. Withdrawn leaves no
#: tombstone, so parking the same message again later stores it anew.
WITHDRAW = """
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 1 end
local ok, m = pcall(cjson.decode, raw)
if ok and type(m) == 'table' and (m.x or (type(m.c) == 'table' and #m.c > 0)) then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"""


class ParkNotReplicated(redis.RedisError):
    """Fewer replicas than asked acknowledged a park within the wait; it was withdrawn."""


class RedisDelayStore:
    """:class:`~.core.DelayStore` on *client*'s Redis, keys under *prefix*."""

    def __init__(
        self,
        client: StoreClient,
        prefix: str,
        tombstone_ttl: float = 86400.0,
        *,
        replicas: int = 0,
        replica_wait: float = 1.0,
    ) -> None:
        self.client = client
        self.keys = delay_keys(prefix)
        self.tombstone_ttl = tombstone_ttl
        #: replicas that must acknowledge a park (``WAIT``) before it counts; 0: no ``WAIT``
        self.replicas = replicas
        self.replica_wait = replica_wait
        self._park = client.register_script(PARK)
        self._withdraw = client.register_script(WITHDRAW)
        self._claim = _DrainingScript(client, CLAIM)
        self._release = _DrainingScript(client, RELEASE)
        self._take = _DrainingScript(client, TAKE)
        self._discard = client.register_script(DISCARD)

    @property
    def _all(self) -> list[str]:
        k = self.keys
        return [k["due"], k["meta"], k["msg"], k["taken"]]

    def park(self, entry_id: str, entry: Entry, delay: float) -> bool:
        """Store *entry*; ``False`` if known already. With :attr:`replicas`, only once that
        many replicas acknowledged it, else :class:`ParkNotReplicated` (entry withdrawn)."""
        delay_ms = max(0, min(int(delay * 1000), 10 * 365 * 86400 * 1000))
        keys = self._all[:3]
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
                pipe.execute_command("EVALSHA", self._park.sha, len(keys), *keys, *args)
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

    def claim(self, lead: float, lease: float, tokens: list[str]) -> Claimed:
        reply = cast(
            "list[Any]",
            self._claim(
                keys=self._all,
                args=[int(lead * 1000), int(lease * 1000), int(self.tombstone_ttl * 1000),
                      MAX_TOKENS, *tokens],
            ),
        )  # fmt: skip
        next_ms = int(reply[0])
        items = [
            Claim(
                entry_id=str(reply[i]),
                token=str(reply[i + 1]),
                attempt=int(reply[i + 2]),
                raw=str(reply[i + 3]),
                due_in=int(reply[i + 4]) / 1000,
            )
            for i in range(1, len(reply), 5)
        ]
        return Claimed(items, None if next_ms < 0 else next_ms / 1000)

    def release(self, entry_id: str, token: str, recheck: float) -> bool:
        reply = self._release(
            keys=[self.keys["due"], self.keys["meta"]],
            args=[entry_id, token, int(recheck * 1000)],
        )
        return bool(reply)

    def take(self, entry_id: str, task_id: str, token: str) -> Taken:
        reply = cast("list[Any]", self._take(keys=self._all, args=[entry_id, task_id, token]))
        return Taken(Take(int(reply[0])), int(reply[1]) / 1000, str(reply[2]))

    def discard(self, entry_id: str) -> None:
        self._discard(keys=[self.keys["due"], self.keys["meta"], self.keys["msg"]], args=[entry_id])

    def depth(self) -> int:
        """Entries not yet taken (parked, claimed or released, waiting for a worker)."""
        return int(self.client.zcard(self.keys["due"]))

    def summary(self) -> dict[str, TaskSummary]:
        """Walks the meta hash (for the CLI; not on any task's path)."""
        now_s, now_us = self.client.time()
        now = now_s * 1000 + now_us // 1000
        out: dict[str, TaskSummary] = {}
        for _entry_id, raw in self.client.hscan_iter(self.keys["meta"], count=1000):
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
