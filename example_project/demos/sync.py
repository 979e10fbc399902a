"""Durable revokes: revoked tasks are discarded, the store holds them, a missed revoke converges."""

from __future__ import annotations

import time
import uuid

from celery import Celery, shared_task

from celery_extras import cluster_revoked, record_revokes

__all__ = ["run", "work"]


@shared_task(name="example.sync.work")
def work(tag: str) -> str:
    return tag


def _all_hold(app: Celery, task_id: str) -> bool:
    workers = cluster_revoked(app, limit=50, timeout=0.5)["workers"]
    return bool(workers) and all(task_id in reply.get("ids", []) for reply in workers.values())


def run(app: Celery) -> list[str]:
    by_id, batch = f"demo-{uuid.uuid4()}", f"batch-{uuid.uuid4().hex[:6]}"
    app.control.revoke(by_id)  # stored, then broadcast
    app.control.revoke_by_stamped_headers({"batch": batch})
    revoked = [
        work.apply_async(("by id",), task_id=by_id),
        work.apply_async(("by stamp",), stamped_headers=["batch"], batch=batch),
    ]
    if work.delay("kept").get(timeout=30) != "kept":
        raise AssertionError("the task that was not revoked did not run")
    deadline = time.monotonic() + 20
    while any(r.state != "REVOKED" for r in revoked):
        if time.monotonic() > deadline:
            raise AssertionError(f"revoked tasks not discarded: {[r.state for r in revoked]}")
        time.sleep(0.05)

    store = cluster_revoked(app, limit=0)["store"]
    if store.get("ids", 0) < 1 or store.get("stamps", 0) < 1:
        raise AssertionError(f"the store does not hold the revokes: {store}")

    # a revoke no worker was sent (as if its broadcast were lost): each worker pulls it
    missed = f"missed-{uuid.uuid4()}"
    began = time.monotonic()
    record_revokes(app, [missed])
    while not _all_hold(app, missed):
        if time.monotonic() - began > 20:
            raise AssertionError("workers did not converge on a store-only revoke")
    took = time.monotonic() - began
    return [
        "revoked by id and by stamped header: both discarded, the third task ran",
        f"durable store holds {store['ids']} revoked ids and {store['stamps']} stamps",
        f"a revoke written only to the store reached every worker in {took:.1f} s "
        f"(sync interval {app.conf.get('extras_sync_interval', 2.0)} s)",
    ]
