"""Faults in the store: logged once per outage with Redis' own words, never a stopped
thread or a flood of lines (issue 17, items 2 and 6)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from celery_extras.store.client import redis_client, store_key
from celery_extras.sync.client import record_revokes
from celery_extras.sync.revoke_store import RevokeStore
from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.outages import store_outages
from tests.support.workers import WorkerProcess, wait_for

INCLUDE = ("tests.support.tasks_reliability",)


def test_retry_memory_logs_an_outage_once_per_process_not_once_per_task(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """38 retried tasks with the store unreachable used to log 57 lines (38 + 19)."""
    cluster.configure(include=INCLUDE, extras_redis_url="redis://127.0.0.1:1/0")
    worker = cluster.worker("w1", concurrency=2)
    results = [send("tests.reliability.retried", i) for i in range(20)]
    assert sorted(r.get(timeout=60) for r in results) == list(range(20))  # all retried, done
    log = worker.log()
    lines = store_outages(log, "retry failure memory")
    assert 1 <= len(lines) <= 2, lines  # once per pool process
    assert "Error 111" in lines[0] or "Connection refused" in lines[0], lines[0]
    assert "failure memory of" not in log and "could not forget" not in log


def _sync_info(cluster: Cluster, worker: WorkerProcess) -> dict[str, Any]:
    stats = cluster.app.control.inspect(timeout=3, destination=[worker.hostname]).stats() or {}
    info: dict[str, Any] = stats.get(worker.hostname, {}).get("extras_sync", {})
    return info


def _holds(cluster: Cluster, worker: WorkerProcess, task_id: str) -> bool:
    replies = cluster.app.control.broadcast(
        "extras_revoked", arguments={"limit": 10000}, reply=True, timeout=3,
        destination=[worker.hostname],
    )  # fmt: skip
    return any(task_id in reply.get(worker.hostname, {}).get("ids", []) for reply in replies)


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_garbage_in_the_sync_counters_neither_stops_sync_nor_lets_a_revoked_task_run(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """``sync:seq`` set to "abc" used to end the sync thread with a ValueError, silently
    (``store: ok``, ``last_sync`` frozen): a revoke that reached only the store then ran."""
    cluster.configure(extras_sync_interval=0.5)
    worker = cluster.worker("w1")
    store = RevokeStore(redis_client(cluster.app), store_key(cluster.app), 1000)
    wait_for(lambda: _sync_info(cluster, worker).get("last_sync"), what="a first sync")
    for keys in store.shard_keys:  # revoked, stamps, log, seq, clock, epoch
        store.client.set(keys[3], "abc")
        store.client.set(keys[4], "1e400")
        store.client.set(keys[5], "e" * 100_000)
    time.sleep(2.0)  # four sync rounds over the garbage (not a wait for a condition)

    task_id = f"store-only-{uuid.uuid4()}"
    record_revokes(cluster.app, [task_id])  # written to the store, never broadcast
    wait_for(lambda: _holds(cluster, worker, task_id), timeout=30, what="the store-only revoke")
    result = send("tests.noop", "revoked", task_id=task_id)
    wait_for(lambda: result.state == "REVOKED", timeout=30, what="the task discarded")
    assert send("tests.noop", "after").get(timeout=30) == "after"
    assert [e["tag"] for e in journal.entries()] == ["after"]
    info = _sync_info(cluster, worker)
    assert info["store"] == "ok" and time.time() - info["last_sync"] < 5, info
    assert worker.alive()

    # a key of the wrong type cannot be repaired: the store is marked in error, with
    # Redis' words and the age of the last good sync, logged once, and sync goes on
    store.client.delete(store.shard_keys[0][0])
    store.client.hset(store.shard_keys[0][0], "not", "a sorted set")
    info = wait_for(
        lambda: (i := _sync_info(cluster, worker)).get("store") == "error" and i,
        timeout=30, what="store: error",
    )  # fmt: skip
    assert "WRONGTYPE" in info["store_error"] and info["last_sync_age"] >= 0, info
    time.sleep(1.5)  # three more failing rounds (not a wait for a condition)
    log = worker.log()
    lines = [line for line in log.splitlines() if "revoke store: the store failed" in line]
    assert len(lines) == 1 and "(ResponseError: WRONGTYPE" in lines[0], log[-3000:]
    store.client.delete(store.shard_keys[0][0])
    wait_for(lambda: _sync_info(cluster, worker).get("store") == "ok", what="store: ok again")
    assert "revoke store: the store answers again after" in worker.log()
