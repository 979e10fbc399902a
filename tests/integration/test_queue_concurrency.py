"""Per-queue concurrency (issue 54): ``extras_queue_concurrency`` on real workers.

A worker ``-c 4`` consuming ``fast`` and ``slow`` with ``{"slow": 1}`` runs at most one task
of ``slow`` at once (with or without a policy of its own), while ``fast`` keeps three or more
pool processes busy, on both brokers; ``{"limit": 2, "scope": "global"}`` holds across two
workers (with the stats off: the caps hook the consumer themselves). Runs are journaled by
the pool processes with their start and end.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import Cluster
from tests.integration.test_concurrency import most_at_once
from tests.support.journal import Journal
from tests.support.workers import wait_for

TASKS = ("tests.support.tasks_queues",)
WORK, LIMITED = "tests.queues.work", "tests.queues.limited_work"


def runs(journal: Journal, queue: str) -> list[tuple[float, float]]:
    return [(e["start"], e["t"]) for e in journal.entries() if e.get("queue") == queue]


def test_a_capped_queue_runs_one_at_a_time_while_the_other_keeps_the_pool(
    cluster: Cluster, journal: Journal
) -> None:
    fast, slow = f"{cluster.ns}.fast", f"{cluster.ns}.slow"
    cluster.configure(include=TASKS, extras_queue_concurrency={slow: 1})
    worker = cluster.worker("qc1", concurrency=4, queues=[fast, slow])
    for i in range(8):  # slow first: without the cap they would take every process
        name = WORK if i % 2 else LIMITED
        cluster.app.send_task(name, args=(slow, i, 0.5), queue=slow)
    for i in range(24):
        cluster.app.send_task(WORK, args=(fast, i, 0.3), queue=fast)
    journal.wait_for_runs(32, timeout=90, what="32 runs")
    slow_runs, fast_runs = runs(journal, slow), runs(journal, fast)
    assert (len(slow_runs), len(fast_runs)) == (8, 24)
    print(f"\nat once: slow {most_at_once(slow_runs)}, fast {most_at_once(fast_runs)}")
    assert most_at_once(slow_runs) == 1
    assert most_at_once(fast_runs) >= 3
    policies = cluster.stats(worker.hostname)["extras_policies"]["queue_concurrency"]
    assert policies["queues"][slow]["cap"] == 1
    assert policies["waited"] >= 1 and policies["admitted"] == 8


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_global_queue_cap_holds_across_two_workers(cluster: Cluster, journal: Journal) -> None:
    slow = f"{cluster.ns}.slow"
    # without stats (whose step also hooks the consumer): the caps' own step hooks it
    cluster.configure(include=TASKS, extras_stats_enabled=False,
                      extras_queue_concurrency={slow: {"limit": 2, "scope": "global"}})  # fmt: skip
    workers = [cluster.worker(n, concurrency=3, queues=[cluster.ns, slow], start=False)
               for n in ("qg1", "qg2")]  # fmt: skip
    for worker in workers:
        worker.start(wait=False)
    for worker in workers:
        worker.wait_ready()
    for i in range(12):
        cluster.app.send_task(WORK, args=(slow, i, 0.4), queue=slow)
    journal.wait_for_runs(12, timeout=90, what="12 runs")
    slow_runs = runs(journal, slow)
    assert len(slow_runs) == 12
    print(f"\nglobal cap 2 over two workers: {most_at_once(slow_runs)} at once")
    assert most_at_once(slow_runs) == 2

    def both_asked() -> Any:
        infos = [cluster.stats(w.hostname)["extras_policies"]["queue_concurrency"] for w in workers]
        return all(i["queues"][slow]["scope"] == "global" for i in infos)

    assert wait_for(both_asked, timeout=30, what="the global cap on both workers")
