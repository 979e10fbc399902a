"""Throughput statistics on real prefork workers: exact counts in events and inspect stats."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery.result import AsyncResult
from celery.utils import uuid

from celery_extras.stats.listener import ClusterState, Listener
from celery_extras.stats.recorder import COUNTERS
from celery_extras.stats.schema import Throughput
from tests.integration.conftest import Cluster
from tests.support.workers import wait_for

STATS_TASKS = ("tests.support.tasks_stats",)
WINDOWS = [1, 10, 60, 3600]


def truth(**per_task: dict[str, int]) -> dict[str, dict[str, int]]:
    return {name: {c: counts.get(c, 0) for c in COUNTERS} for name, counts in per_task.items()}


EXPECTED = truth(
    **{
        "tests.stats.succeeds": {"received": 10, "started": 10, "succeeded": 10},
        "tests.stats.fails": {"received": 4, "started": 4, "failed": 4},
        "tests.stats.retries_once": {
            "received": 6,
            "started": 6,
            "retried": 3,
            "succeeded": 3,
        },
        "tests.stats.rejects": {"received": 2, "started": 2, "rejected": 2},
        "tests.stats.revoked": {"revoked": 3},
    }
)


@pytest.fixture
def listening(cluster: Cluster) -> Iterator[ClusterState]:
    state = ClusterState()
    listener = Listener(cluster.app, state, wakeup=False)
    listener.start()
    try:
        wait_for(listener.ready.is_set, timeout=30, what="event listener consuming")
        yield state
    finally:
        listener.stop()


def counts_in(figures: dict[str, Any], window: int) -> dict[str, dict[str, int]]:
    """``{task: {counter: count}}`` over *window* from an event's or inspect's ``tasks``."""
    i = figures["windows"].index(window)
    return {
        name: {c: task[c][i] for c in COUNTERS}
        for name, task in figures["tasks"].items()
    }  # fmt: skip


def as_figures(t: Throughput) -> dict[str, Any]:
    return {
        "windows": list(t.windows),
        "tasks": {name: dict(f.counts) for name, f in t.tasks.items()},
    }


def run_known_workload(cluster: Cluster, send: Callable[..., Any], hostname: str) -> None:
    """10 successes, 4 failures, 3 tasks retried once, 2 rejects, 3 revoked before receipt."""
    revoked_ids = [uuid() for _ in range(3)]
    replies = cluster.app.control.revoke(
        revoked_ids, destination=[hostname], reply=True, timeout=10
    )
    assert replies, "the worker did not acknowledge the revoke"
    results = [send("tests.stats.succeeds", i) for i in range(10)]
    results += [send("tests.stats.fails") for _ in range(4)]
    results += [send("tests.stats.retries_once") for _ in range(3)]
    results += [send("tests.stats.rejects") for _ in range(2)]
    revoked = [send("tests.stats.revoked", task_id=i) for i in revoked_ids]
    for result in results:
        result.get(timeout=60, propagate=False)
    states = sorted(r.state for r in results)
    assert states == sorted(["SUCCESS"] * 13 + ["FAILURE"] * 6), states
    for r in revoked:
        wait_for(lambda r=r: AsyncResult(r.id, app=cluster.app).state == "REVOKED",
                 timeout=60, what=f"revoked {r.id}")  # fmt: skip


def test_prefork_worker_counts_equal_the_truth_in_events_and_inspect_stats(
    cluster: Cluster, send: Callable[..., Any], listening: ClusterState
) -> None:
    cluster.configure(include=STATS_TASKS, extras_stats_interval=0.5)
    worker = cluster.worker("stats1", concurrency=2, pool="prefork")
    run_known_workload(cluster, send, worker.hostname)
    expected = EXPECTED

    def latest() -> dict[str, Any] | None:
        figures = listening.workers().get(worker.hostname)
        return as_figures(figures) if figures is not None else None

    # counts only grow within the hour window: once equal, they must stay equal
    wait_for(
        lambda: (f := latest()) is not None and counts_in(f, 3600) == expected,
        timeout=60,
        what=f"worker-throughput event equal to the truth; last: {latest()}",
    )
    seen = listening.received
    wait_for(lambda: listening.received >= seen + 3, timeout=30, what="three more events")
    event = latest()
    assert event is not None and event["windows"] == WINDOWS
    assert counts_in(event, 3600) == expected
    assert counts_in(event, 60) == expected  # the whole run fits in the last minute

    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=5).stats()
    extras = stats[worker.hostname]["extras"]
    assert extras["windows"] == WINDOWS
    assert counts_in(extras, 3600) == expected
    assert counts_in(extras, 60) == expected
    runtimes = {name: t["runtime"] for name, t in extras["tasks"].items()}
    assert runtimes["tests.stats.succeeds"]["count"] == 10
    assert runtimes["tests.stats.retries_once"]["count"] == 3
    assert runtimes["tests.stats.fails"]["count"] == 0
    for figures in runtimes.values():
        if figures["count"]:
            assert 0 < figures["p50"] <= figures["p95"] <= figures["p99"] <= figures["max"]
