"""Per-item failure counts in Redis, so every worker sees (and forgets) the same ones.

One string key per (task, limiter, item), incremented atomically and given a
time to live so items that are never retried again do not stay forever.
"""

from __future__ import annotations

import redis

from .failure_memory import Counts, CountsFactory

__all__ = ["RedisCounts", "redis_counts"]


class RedisCounts:
    """:class:`~celery_extras.retries.failure_memory.Counts` under *prefix* in *client*'s Redis."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, prefix: str, ttl: float) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_ms = max(1, int(ttl * 1000))

    def key(self, item: str) -> str:
        return f"{self.prefix}:{item}"

    def incr(self, item: str) -> int:
        pipe = self.client.pipeline()
        pipe.incr(self.key(item))
        pipe.pexpire(self.key(item), self.ttl_ms)
        count, _ = pipe.execute()
        return max(1, int(count))  # a negative count stored (not ours) counts this failure

    def get(self, item: str) -> int:
        raw = self.client.get(self.key(item))
        try:  # a negative count is not ours either: no failure remembered
            return max(0, int(raw)) if raw is not None else 0
        except ValueError:  # not ours: treat as no memory rather than fail the task
            return 0

    def forget(self, item: str) -> None:
        self.client.delete(self.key(item))


def redis_counts(
    client: redis.Redis | redis.RedisCluster, prefix: str, ttl: float
) -> CountsFactory:
    """A factory giving each limiter of a composite policy its own keys under *prefix*."""

    def counts(path: str) -> Counts:
        return RedisCounts(client, f"{prefix}:{path}", ttl)

    return counts
