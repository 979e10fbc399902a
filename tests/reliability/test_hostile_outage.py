"""A 10 s store outage with tasks arriving: a global limit stays within the documented
bound, ``workers x (rate + burst)`` starts in any second, and no task is lost or run twice
(issue 17, item 5). The store is a private Redis the test stops; the broker is shared."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster
from tests.support.brokers import PrivateRedis
from tests.support.journal import Journal
from tests.support.outages import store_outages, store_recoveries
from tests.support.rates import busiest_second
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_reliability",)
LIMITED = "tests.reliability.limited"  # 10/s, burst 2, global, acks_late
RATE, BURST, WORKERS = 10, 2, 2


@pytest.mark.scenario
def test_store_outage_keeps_a_global_limit_within_workers_times_rate_plus_burst(
    cluster: Cluster, send: Callable[..., Any], journal: Journal, tmp_path: Path
) -> None:
    store = PrivateRedis(tmp_path).start()
    try:
        cluster.configure(include=INCLUDE, extras_redis_url=store.url)
        for name in ("w1", "w2"):
            cluster.worker(name, start=False).start(wait=False)
        for worker in cluster.workers:
            worker.wait_ready()
        sent: list[str] = []

        def arrivals() -> None:  # 20 tasks a second for 14 s: twice the limit
            for i in range(280):
                sent.append(send(LIMITED, i).id)
                time.sleep(0.05)

        publisher = threading.Thread(target=arrivals)
        publisher.start()
        time.sleep(2.0)  # arrivals under the global limit first, booking slots ahead
        store.stop()
        outage_start = time.time()
        time.sleep(10.0)  # the outage itself, not a wait for a condition
        outage_end = time.time()
        store.start()
        publisher.join()
        wait_for(lambda: len(journal) >= 280, timeout=120, interval=0.5, what="280 runs")
    finally:
        store.stop()
    entries = journal.entries()
    runs = Counter(e["id"] for e in entries)
    assert set(runs) == set(sent) and max(runs.values()) == 1  # none lost, none twice
    times = sorted(e["t"] for e in entries)
    during = [t for t in times if outage_start - 1 <= t <= outage_end + 1]
    print(f"busiest second: {busiest_second(times)} (outage: {busiest_second(during)}), "
          f"bound {WORKERS * (RATE + BURST)}")  # fmt: skip
    assert busiest_second(times) <= WORKERS * (RATE + BURST)
    for worker in cluster.workers:
        log = worker.log()
        # one line per process and outage for every user (the limits, the delay store's
        # arrival gate and mover, the revoke store), whichever met it first
        assert len(store_outages(log, "global limits")) == 1, log[-3000:]
        assert len(store_outages(log)) == 1 and len(store_recoveries(log)) == 1, log[-3000:]
