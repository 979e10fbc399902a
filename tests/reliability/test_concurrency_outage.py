"""A store outage under concurrency(2): the cap applies per worker while the store is away
(``extras_concurrency_on_store_error="local"``), cluster-wide again once it answers, each
transition logged once per worker, and no task lost or run twice. The store is a private
Redis the test stops; the broker is shared."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster
from tests.integration.test_concurrency import GLOBAL2, ends, most_at_once
from tests.support.brokers import PrivateRedis
from tests.support.journal import Journal
from tests.support.outages import store_outages, store_recoveries
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_concurrency",)


@pytest.mark.scenario
def test_store_outage_caps_per_worker_then_cluster_wide_and_loses_nothing(
    cluster: Cluster, send: Callable[..., Any], journal: Journal, tmp_path: Path
) -> None:
    store = PrivateRedis(tmp_path).start()
    try:
        cluster.configure(include=INCLUDE, extras_redis_url=store.url)
        for name in ("w1", "w2"):
            cluster.worker(name, concurrency=3, start=False).start(wait=False)
        for worker in cluster.workers:
            worker.wait_ready()
        sent = [send(GLOBAL2, i).id for i in range(20)]
        wait_for(lambda: len(ends(journal, GLOBAL2)) >= 4, timeout=30, what="4 runs")
        store.stop()
        outage_start = time.time()
        sent += [send(GLOBAL2, i).id for i in range(20, 40)]
        time.sleep(3.0)  # the outage itself, not a wait for a condition
        store.start()
        outage_end = time.time()
        sent += [send(GLOBAL2, i).id for i in range(40, 60)]
        wait_for(lambda: len(ends(journal, GLOBAL2)) >= 60, timeout=120, interval=0.5,
                 what="60 runs")  # fmt: skip
    finally:
        store.stop()
    runs = ends(journal, GLOBAL2)
    counted = Counter(e["id"] for e in runs)
    assert set(counted) == set(sent) and max(counted.values()) == 1  # none lost, none twice
    intervals = [(e["start"], e["t"]) for e in runs]
    assert most_at_once(intervals) <= 2 * 2  # per worker during the outage
    before = [(s, e) for s, e in intervals if e < outage_start]
    settled = [(s, e) for s, e in intervals if s > outage_end + 1.0]  # outage runs ended
    assert most_at_once(before) == 2 and most_at_once(settled) == 2
    for worker in cluster.workers:
        log = worker.log()
        # one line per process and outage, whichever user met it first
        assert len(store_outages(log, "concurrency slots")) == 1, log[-3000:]
        assert len(store_recoveries(log)) == 1, log[-3000:]
