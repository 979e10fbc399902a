"""Memory stays bounded under revoke traffic (issue 17, item 4): 200,000 revokes, then
1,000 a second for 30 s, and the worker's RSS ends within 20 MB of where it started.
Celery's own revoked set holds at most 50,000 ids; celery-extras keeps nothing per id
beside it, reads the store a page at a time, and hands a burst's freed pages back to
the system. Nothing the client stored is pushed back, and a hello reply stays within
its byte budget. RSS is the worker's main process; the figures are printed (``-s``)
for the docs (plain Celery, same traffic: +19.6 MB)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from celery_extras.sync.control import HELLO_REPLY_BYTES
from tests.integration.conftest import Cluster
from tests.support.workers import WorkerProcess, wait_for

MB = 1024 * 1024


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def sync_info(cluster: Cluster, worker: WorkerProcess) -> dict[str, Any]:
    stats = cluster.app.control.inspect(timeout=5, destination=[worker.hostname]).stats() or {}
    info: dict[str, Any] = stats.get(worker.hostname, {}).get("extras_sync", {})
    return info


@pytest.mark.scenario
@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_revoke_traffic_keeps_worker_memory_and_hello_replies_bounded(cluster: Cluster) -> None:
    # Celery marks each revoked id REVOKED in the result backend, one round trip each:
    # an in-memory backend (bounded, 5,000 results) keeps 230,000 of them quick
    app = cluster.configure(result_backend="cache+memory://")
    worker = cluster.worker("w1", concurrency=1)
    wait_for(lambda: sync_info(cluster, worker).get("last_sync"), what="a first sync")
    start = rss(worker.pid)

    prefix = uuid.uuid4().hex[:8]
    for chunk in range(40):  # 200,000 revokes, 5,000 per broadcast (stored first)
        app.control.revoke([f"{prefix}-a{chunk}-{i}" for i in range(5000)])
    wait_for(lambda: worker.log().count("Tasks flagged as revoked") >= 40, timeout=120,
             interval=0.5, what="every revoke broadcast handled")  # fmt: skip
    time.sleep(5.0)  # two sync rounds after the last revoke (not a wait for a condition)
    after_bulk = rss(worker.pid)

    began = time.monotonic()
    for tick in range(300):  # 1,000 a second for 30 s: 100 every 0.1 s
        app.control.revoke([f"{prefix}-b{tick}-{i}" for i in range(100)])
        time.sleep(max(0.0, began + (tick + 1) * 0.1 - time.monotonic()))
    wait_for(lambda: worker.log().count("Tasks flagged as revoked") >= 340, timeout=120,
             interval=0.5, what="every revoke broadcast handled")  # fmt: skip
    time.sleep(5.0)  # two sync rounds after the last revoke (not a wait for a condition)
    end = rss(worker.pid)
    info = sync_info(cluster, worker)

    replies = app.control.broadcast(
        "extras_sync_hello", arguments={"from_node": "probe@test", "clock": 1}, reply=True,
        timeout=5, destination=[worker.hostname],
    )  # fmt: skip
    hello = len(json.dumps(replies[0][worker.hostname]))
    print(
        f"RSS start {start / MB:.1f} MB, after 200,000 revokes {after_bulk / MB:.1f} MB, "
        f"after 30 s at 1,000/s {end / MB:.1f} MB (+{(end - start) / MB:.1f} MB); "
        f"revoked {info['revoked']}, unstored {info['unstored']}, pushed {info['pushed']}, "
        f"pulls {info['pulls']}, trims {info['trims']}; "
        f"hello reply {hello} bytes"
    )
    assert info["revoked"] <= 50_000 and info["unstored"] <= 50_000, info
    assert info["pushed"] <= 230_000 // 100, info  # the client stored them: at most 1 % again
    assert hello <= HELLO_REPLY_BYTES + 200
    assert end - start <= 20 * MB
