"""Control commands of the sync capability, and the cluster-wide listing behind ``extras revoked``.

``extras_sync_hello`` answers a starting neighbour (its clock merged, ours and a
bounded list of our revokes sent back); ``extras_revoked`` lists what a worker
holds. Both reply with JSON-safe data only and validate their arguments.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.worker.control import inspect_command

from ..store import StoreUnavailable, redis_client, store_key
from .entries import valid_clock
from .revoke_store import RevokeStore
from .syncer import HELLO, Syncer

__all__ = ["SYNCER_ATTR", "cluster_revoked", "extras_revoked", "extras_sync_hello"]

#: Attribute of the worker's consumer holding its :class:`~.syncer.Syncer`.
SYNCER_ATTR = "extras_syncer"


def _syncer(state: Any) -> Syncer | None:
    return getattr(state.consumer, SYNCER_ATTR, None)


def extras_sync_hello(
    state: Any, from_node: Any = None, clock: Any = None, **kwargs: Any
) -> dict[str, Any] | None:
    """A neighbour starts: merge its clock, send ours and our newest revokes (bounded)."""
    syncer = _syncer(state)
    if syncer is None or from_node == state.hostname:
        return None
    app_clock = state.app.clock
    merged = app_clock.adjust(clock) if valid_clock(clock) else app_clock.forward()
    stamps = [[h, v] for h, v in syncer.revokes.local_stamps()][: syncer.reply_max]
    return {
        "clock": merged,
        "revoked": syncer.revokes.newest_ids(syncer.reply_max),
        "stamps": stamps,
    }


inspect_command(visible=False, name=HELLO)(extras_sync_hello)


def extras_revoked(state: Any, limit: Any = 100, **kwargs: Any) -> dict[str, Any]:
    """What this worker holds: counts, the newest *limit* ids and stamps, and its sync state."""
    syncer = _syncer(state)
    if syncer is None:
        return {"error": "celery-extras sync is not running on this worker"}
    if isinstance(limit, str) and limit.isdigit():
        limit = int(limit)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= 10000:
        return {"error": f"limit {limit!r}: expected an integer from 0 to 10000"}
    return {
        "ids": syncer.revokes.newest_ids(limit) if limit else [],
        "stamps": [[h, v] for h, v in syncer.revokes.local_stamps()][:limit],
        "sync": syncer.info(),
    }


inspect_command(args=[("limit", int)], signature="[limit]")(extras_revoked)


def cluster_revoked(app: Celery, limit: int = 20, timeout: float = 1.0) -> dict[str, Any]:
    """``{"store": {...} | {"error"}, "workers": {hostname: reply}}`` for ``extras revoked``."""
    store: dict[str, Any]
    try:
        from ..install import settings_of

        revoke_store = RevokeStore(
            redis_client(app), store_key(app), settings_of(app)["revoke_max"]
        )
        store = {**revoke_store.counts(), **revoke_store.newest(limit)}
    except StoreUnavailable as exc:
        store = {"error": str(exc)}
    except Exception as exc:  # redis down: still list the workers
        store = {"error": repr(exc)}
    workers: dict[str, Any] = {}
    replies = app.control.broadcast(
        "extras_revoked", arguments={"limit": limit}, reply=True, timeout=timeout
    )
    for reply in replies or []:
        workers.update(reply)
    return {"store": store, "workers": workers}
