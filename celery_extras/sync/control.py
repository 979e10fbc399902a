"""Control commands of the sync capability, and the cluster-wide listing behind ``extras revoked``.

``extras_sync_hello`` answers a starting neighbour (its clock merged, ours and a
bounded list of our revokes sent back); ``extras_revoked`` lists what a worker
holds. Both reply with JSON-safe data only and validate their arguments.
Celery's own ``revoke`` is wrapped to note the ids it adds, so the worker writes them to
the store, unless :data:`STORED_UNTIL`, the mark a storing client puts on its
broadcast, says the store has them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.worker.control import Panel, inspect_command

from ..bounds import shown
from ..checks import is_int
from ..settings import settings_of
from ..store.client import StoreUnavailable, redis_client, store_key
from .entries import valid_clock
from .revoke_store import RevokeStore
from .syncer import HELLO, Syncer

__all__ = [
    "HELLO_REPLY_BYTES",
    "STORED_UNTIL",
    "SYNCER_ATTR",
    "cluster_revoked",
    "extras_revoked",
    "extras_sync_hello",
    "within_bytes",
]

#: Attribute of the worker's consumer holding its :class:`~.syncer.Syncer`.
SYNCER_ATTR = "extras_syncer"

#: Budget of the revokes in one hello reply (JSON characters, ids and stamps together):
#: every worker answers every starting one, so the replies stay small; the store holds
#: the rest and the new worker reads it anyway.
HELLO_REPLY_BYTES = 64 * 1024


def within_bytes(items: list[Any], budget: int) -> tuple[list[Any], int]:
    """The newest (last) *items* whose JSON fits in *budget* characters, and what is left."""
    kept: list[Any] = []
    for item in reversed(items):
        size = len(json.dumps(item)) + 2  # the separator
        if size > budget:
            break
        budget -= size
        kept.append(item)
    kept.reverse()
    return kept, budget


#: The argument a storing client adds to its ``revoke`` broadcast: the Unix time until
#: which the store holds these ids. Celery's ``revoke`` takes ``**kwargs``, so a worker
#: without celery-extras ignores it.
STORED_UNTIL = "extras_stored_until"


def _syncer(state: Any) -> Syncer | None:
    return getattr(state.consumer, SYNCER_ATTR, None)


def _noting_revoked(revoke: Callable[..., Any]) -> Callable[..., Any]:
    """Celery's ``revoke`` command, which then notes the ids the store does not hold yet.

    Ids a storing client marked as stored are not written back: without the mark, a
    broadcast that outruns the next pull (or ids the bounded store has already
    evicted) would be written back by every worker.
    """

    @functools.wraps(revoke)
    def noting_revoked(state: Any, *args: Any, **kwargs: Any) -> Any:
        stored_until = kwargs.pop(STORED_UNTIL, None)
        reply = revoke(state, *args, **kwargs)
        syncer = _syncer(state)
        if syncer is not None:
            task_ids = args[0] if args else kwargs.get("task_id")
            syncer.revokes.note_revoked(task_ids, stored_until)
        return reply

    noting_revoked.extras_noting_revoked = True  # type: ignore[attr-defined]
    return noting_revoked


if not getattr(Panel.data["revoke"], "extras_noting_revoked", False):
    Panel.data["revoke"] = _noting_revoked(Panel.data["revoke"])


def extras_sync_hello(
    state: Any, from_node: Any = None, clock: Any = None, **kwargs: Any
) -> dict[str, Any] | None:
    """A neighbour starts: merge its clock, send ours and our newest revokes (bounded)."""
    syncer = _syncer(state)
    if syncer is None or from_node == state.hostname:
        return None
    app_clock = state.app.clock
    merged = app_clock.adjust(clock) if valid_clock(clock) else app_clock.forward()
    ids, budget = within_bytes(syncer.revokes.newest_ids(syncer.reply_max), HELLO_REPLY_BYTES)
    stamps = [[h, v] for h, v in syncer.revokes.local_stamps()][-syncer.reply_max :]
    return {"clock": merged, "revoked": ids, "stamps": within_bytes(stamps, budget)[0]}


inspect_command(visible=False, name=HELLO)(extras_sync_hello)


def extras_revoked(state: Any, limit: Any = 100, **kwargs: Any) -> dict[str, Any]:
    """What this worker holds: counts, the newest *limit* ids and stamps, and its sync state."""
    syncer = _syncer(state)
    if syncer is None:
        return {"error": "celery-extras sync is not running on this worker"}
    if isinstance(limit, str) and limit.isdecimal() and len(limit) <= 6:
        limit = int(limit)
    if not is_int(limit, minimum=0, maximum=10000):
        return {"error": f"limit {shown(limit)}: expected an integer from 0 to 10000"}
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
        revoke_store = RevokeStore(
            redis_client(app, background=True), store_key(app), settings_of(app)["revoke_max"]
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
