"""A token bucket shared by every worker: one atomic Lua script per acquire on Redis.

The script keeps the bucket as a theoretical arrival time (GCRA, the same
arithmetic as :class:`~celery_extras.policies.token_bucket.TokenBucket`) in
microseconds of the *Redis server's* clock (``TIME``), so workers whose clocks
disagree still share one exact rate. Each acquire books a slot and returns the
exact wait until it (0: go now). A bucket key expires as soon as the bucket is
full again, so idle per-key buckets cost nothing. A rate changed at run time
(``celery extras limit``) sits in one hash the script reads on every acquire.
No Celery import: the client is any ``redis.Redis``.
"""

from __future__ import annotations

import json
import math
from typing import cast

import redis

__all__ = ["ACQUIRE_SCRIPT", "GlobalBucket", "Override"]

#: KEYS: bucket, overrides hash. ARGV: interval us, burst, task name, tokens.
#: Returns {wait us, interval us in force, burst in force}.
ACQUIRE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local raw = redis.call('HGET', KEYS[2], ARGV[3])
if raw then
  local ok, o = pcall(cjson.decode, raw)
  if ok and type(o) == 'table' then
    if type(o.rate) == 'number' and o.rate > 0 then interval = math.ceil(1000000 / o.rate) end
    if type(o.burst) == 'number' and o.burst >= 1 then burst = math.floor(o.burst) end
  end
end
local tokens = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat < now then tat = now end
local wait = tat + (tokens - burst) * interval - now
if wait < 0 then wait = 0 end
local new_tat = tat + tokens * interval
redis.call('SET', KEYS[1], string.format('%.0f', new_tat),
           'PX', math.floor((new_tat - now) / 1000) + 1000)
return {wait, interval, burst}
"""


class Override:
    """A rate (tasks per second) and optional burst set at run time for one task."""

    __slots__ = ("burst", "rate", "text")

    def __init__(self, rate: float, burst: int | None = None, text: str = "") -> None:
        self.rate = rate
        self.burst = burst
        self.text = text

    def dumps(self) -> str:
        return json.dumps({"rate": self.rate, "burst": self.burst, "text": self.text})

    @classmethod
    def loads(cls, raw: str) -> Override:
        """Parse a stored override; :class:`ValueError` naming what is wrong."""
        try:
            data = json.loads(raw)
            rate, burst = data["rate"], data.get("burst")
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"stored limit {raw!r} is not a JSON rate: {exc}") from None
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise ValueError(f"stored limit {raw!r}: rate must be a number > 0")
        if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int)
                                  or burst < 1):  # fmt: skip
            raise ValueError(f"stored limit {raw!r}: burst must be an integer >= 1")
        return cls(float(rate), burst, str(data.get("text") or ""))


class GlobalBucket:
    """Cluster-wide token buckets under *prefix* in *client*'s Redis."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.overrides_key = f"{prefix}:limits"
        self._acquire = client.register_script(ACQUIRE_SCRIPT)

    def bucket_key(self, name: str, key: str = "") -> str:
        return f"{self.prefix}:bucket:{name}:{key}"

    def reserve(self, name: str, rate: float, burst: int, key: str = "", tokens: int = 1) -> float:
        """Book *tokens* of *name*'s bucket (for *key*); seconds to wait, 0 meaning go now.

        *rate* and *burst* are the task's own; an override stored for *name* wins.
        Raises the client's :class:`redis.RedisError` when the store cannot answer.
        """
        interval_us = max(1, math.ceil(1_000_000 / rate))
        reply = cast(
            "list[int]",
            self._acquire(
                keys=[self.bucket_key(name, key), self.overrides_key],
                args=[interval_us, burst, name, tokens],
            ),
        )
        return int(reply[0]) / 1_000_000

    def set_override(self, name: str, override: Override | None) -> None:
        """Store (or with ``None`` remove) the run-time rate of *name*."""
        if override is None:
            self.client.hdel(self.overrides_key, name)
        else:
            self.client.hset(self.overrides_key, name, override.dumps())

    def overrides(self) -> dict[str, str]:
        """Every stored run-time rate, raw: ``{task name: JSON}``."""
        return cast("dict[str, str]", self.client.hgetall(self.overrides_key))
