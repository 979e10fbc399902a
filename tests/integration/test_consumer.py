"""Weighted fair consumption on real workers, on Redis and on RabbitMQ."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.integration.conftest import Cluster
from tests.support.brokers import PrivateRedis
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_consumer",)


def publish(cluster: Cluster, queue: str, n: int, seconds: float = 0.02) -> list[str]:
    app = cluster.app
    with app.producer_or_acquire() as producer:
        return [
            app.send_task("tests.consumer.work", args=(queue, time.time(), seconds),
                          queue=f"{cluster.ns}.{queue}", producer=producer).id
            for _ in range(n)
        ]  # fmt: skip


def runs(journal: Journal) -> list[dict[str, Any]]:
    return sorted(journal.entries(), key=lambda e: e["t"])


def test_backlogged_queues_share_the_worker_by_weight(cluster: Cluster, journal: Journal) -> None:
    ns = cluster.ns
    cluster.configure(include=INCLUDE, extras_queue_weights={f"{ns}.a": 3, f"{ns}.b": 1})
    publish(cluster, "a", 600)
    publish(cluster, "b", 600)
    worker = cluster.worker("w1", queues=(f"{ns}.a", f"{ns}.b"))
    wait_for(lambda: len(journal) >= 400, timeout=120, interval=0.2, what="400 completions")
    first = Counter(e["queue"] for e in runs(journal)[:400])
    ratio = first["a"] / first["b"]
    print(f"\n{cluster.broker.split(':')[0]}: first 400 = {dict(first)}, a:b = {ratio:.2f}")
    assert 2.7 <= ratio <= 3.3, first

    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=3).stats() or {}
    queues = stats[worker.hostname]["extras_queues"]
    assert queues["weights"] == {f"{ns}.a": 3, f"{ns}.b": 1}
    assert all(n <= queues["prefetch_per_queue"] for n in queues["buffered"].values())


def trickle_waits(cluster: Cluster, journal: Journal, flood: int, trickle: int) -> list[float]:
    """Flood queue a, then send *trickle* tasks to b one by one; b's publish-to-start waits."""
    publish(cluster, "a", flood)
    wait_for(lambda: len(journal) >= 50, timeout=60, what="the flood to be under way")
    for _ in range(trickle):
        publish(cluster, "b", 1)
        time.sleep(0.05)
    wait_for(
        lambda: sum(e["queue"] == "b" for e in journal.entries()) >= trickle,
        timeout=120, interval=0.2, what="every trickle task",
    )  # fmt: skip
    return [e["waited"] for e in journal.entries() if e["queue"] == "b"]


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def test_trickle_queue_is_served_promptly_under_a_flood(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    ns = cluster.ns
    queues = (f"{ns}.a", f"{ns}.b")
    cluster.configure(include=INCLUDE, plain=True)
    plain = cluster.worker("plain", queues=queues)
    plain_waits = trickle_waits(cluster, journal, flood=600, trickle=20)
    plain.stop()
    cluster.app.control.purge()
    journal.clear()

    cluster.configure(
        include=INCLUDE, plain=False, extras_queue_weights={queues[0]: 1, queues[1]: 10}
    )
    cluster.worker("fair", queues=queues)
    fair_waits = trickle_waits(cluster, journal, flood=600, trickle=20)

    print(f"\n{cluster.broker.split(':')[0]}: trickle p95 wait plain {p95(plain_waits):.3f} s, "
          f"weighted {p95(fair_waits):.3f} s")  # fmt: skip
    assert p95(fair_waits) * 3 <= p95(plain_waits)
    assert p95(fair_waits) <= 0.5  # the 0.15 s target is measured on a quiet machine in bench/


def test_broker_restart_mid_run_loses_nothing_and_shares_recover(
    ns: str, tmp_path: Path, journal: Journal
) -> None:
    server = PrivateRedis(tmp_path).start()
    cluster = Cluster(server.url, ns, tmp_path)
    try:
        queues = (f"{ns}.a", f"{ns}.b")
        cluster.configure(
            include=INCLUDE,
            extras_queue_weights={queues[0]: 3, queues[1]: 1},
            broker_transport_options={"visibility_timeout": 5, "unacked_restore_interval": 1},
        )
        ids = set(publish(cluster, "a", 300, seconds=0.01) + publish(cluster, "b", 300, 0.01))
        worker = cluster.worker("w1", queues=queues)
        wait_for(lambda: len(journal) >= 100, timeout=60, what="the run to be under way")
        server.restart()
        wait_for(lambda: worker.log().count("Connected to redis") >= 2, timeout=60,
                 what="the worker to reconnect")  # fmt: skip
        before = len(journal)
        wait_for(
            lambda: {e["id"] for e in journal.entries()} >= ids,
            timeout=120, interval=0.5, what="every task after the broker restart",
        )  # fmt: skip
        entries = runs(journal)
        after = Counter(e["queue"] for e in entries[before : before + 200])
        print(f"\nafter the restart: next 200 = {dict(after)}")
        assert 2.5 <= after["a"] / after["b"] <= 3.5, after
        assert worker.alive()
        # Celery logs the lost connection's tracebacks itself; none may pass through our code.
        assert "celery_extras/" not in worker.log()
    finally:
        cluster.stop()
        server.stop()
