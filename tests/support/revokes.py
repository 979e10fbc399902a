"""Writing raw entries into the durable revoke store, as a foreign or hostile writer would."""

from __future__ import annotations

from celery_extras.sync.revoke_store import RevokeStore

__all__ = ["write_raw_entry"]


def write_raw_entry(
    store: RevokeStore, shard: int, member: str, expiry: float, stamp: bool = False
) -> None:
    """Put *member* into *shard*'s ids (or stamps) and log its change, with no validation."""
    revoked, stamps, log, seq = store.shard_keys[shard][:4]
    store.client.zadd(stamps if stamp else revoked, {member: expiry})
    store.client.zadd(log, {("s:" if stamp else "i:") + member: store.client.incr(seq)})
