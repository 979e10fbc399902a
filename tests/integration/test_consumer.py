"""Weighted fair consumption on real workers, on Redis and on RabbitMQ."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from celery_extras.delay.entry import DUE_SUFFIX
from tests.integration.conftest import Cluster, restartable_cluster
from tests.support import flood
from tests.support.brokers import Restartable
from tests.support.journal import Journal
from tests.support.workers import wait_for

#: Timing is asserted here (rates, latencies): under pytest-xdist these tests run alone.
pytestmark = pytest.mark.exclusive

INCLUDE = ("tests.support.tasks_consumer",)


def publish(cluster: Cluster, queue: str, n: int, seconds: float = 0.02) -> list[str]:
    return flood.publish(cluster.app, f"{cluster.ns}.{queue}", n, seconds)


def test_backlogged_queues_share_the_worker_by_weight(cluster: Cluster, journal: Journal) -> None:
    ns = cluster.ns
    # with the ETA store on, the worker consumes the due queue of each queue too (an app
    # that parks nothing has none), and the fair consumer serves those first
    cluster.configure(include=INCLUDE, extras_queue_weights={f"{ns}.a": 3, f"{ns}.b": 1},
                      extras_eta_store=True)  # fmt: skip
    publish(cluster, "a", 600)
    publish(cluster, "b", 600)
    worker = cluster.worker("w1", queues=(f"{ns}.a", f"{ns}.b"))
    wait_for(lambda: len(journal) >= 400, timeout=120, interval=0.2, what="400 completions")
    first = Counter(e["queue"] for e in flood.runs(journal)[:400])
    ratio = first[f"{ns}.a"] / first[f"{ns}.b"]
    print(f"\n{cluster.broker.split(':')[0]}: first 400 = {dict(first)}, a:b = {ratio:.2f}")
    assert 2.7 <= ratio <= 3.3, first

    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=3).stats() or {}
    queues = stats[worker.hostname]["extras_queues"]
    assert queues["weights"] == {f"{ns}.a": 3, f"{ns}.b": 1}
    assert sorted(queues["served_first"]) == [f"{ns}.a.extras-due", f"{ns}.b.extras-due"]
    assert all(n <= queues["prefetch_per_queue"] for n in queues["buffered"].values())


@pytest.mark.scenario
@pytest.mark.exclusive  # a latency: alone, not beside another scenario
def test_trickle_queue_is_served_promptly_under_a_flood(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    ns = cluster.ns
    queues = (f"{ns}.a", f"{ns}.b")
    cluster.configure(include=INCLUDE, plain=True)
    plain = cluster.worker("plain", queues=queues)
    plain_waits = flood.trickle_waits(cluster.app, journal, *queues, n_flood=600, n_trickle=40)
    plain.stop()
    cluster.app.control.purge()
    journal.clear()

    cluster.configure(
        include=INCLUDE, plain=False, extras_queue_weights={queues[0]: 1, queues[1]: 10}
    )
    cluster.worker("fair", queues=queues)
    fair_waits = flood.trickle_waits(cluster.app, journal, *queues, n_flood=600, n_trickle=40)

    plain_p95, fair_p95 = flood.p95(plain_waits), flood.p95(fair_waits)
    name = cluster.broker.split(":")[0]
    print(f"\n{name}: trickle p95 wait plain {plain_p95:.3f} s, weighted {fair_p95:.3f} s")
    print(f"weighted waits (ms), in order: {[round(w * 1000) for w in fair_waits]}")
    assert fair_p95 * 3 <= plain_p95
    assert fair_p95 <= 0.5  # the 0.15 s target is measured on a quiet machine in bench/


@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_broker_restart_mid_run_loses_nothing_and_shares_recover(
    kind: str, ns: str, tmp_path: Path, journal: Journal
) -> None:
    with restartable_cluster(kind, ns, tmp_path) as (cluster, broker):
        run_weighted_through_a_restart(cluster, journal, broker)


def run_weighted_through_a_restart(cluster: Cluster, journal: Journal, broker: Restartable) -> None:
    ns = cluster.ns
    queues = (f"{ns}.a", f"{ns}.b")
    cluster.configure(
        include=INCLUDE,
        extras_queue_weights={queues[0]: 3, queues[1]: 1},
        broker_transport_options={"visibility_timeout": 5, "unacked_restore_interval": 1},
    )
    # Enough of each that both queues are still backlogged for 200 runs after the restart,
    # however long stopping the broker lets the worker go on (one second is 100 runs): the
    # weights drain "a" three times as fast, so it has three times as many, and both last
    # 1,600 runs (with 500 of each, "a" ran dry by the 667th, and a slow RabbitMQ restart
    # in CI let the worker run over 460 before the measure began).
    ids = set(publish(cluster, "a", 1200, seconds=0.01) + publish(cluster, "b", 400, 0.01))
    worker = cluster.worker("w1", queues=queues)
    wait_for(lambda: len(journal) >= 100, timeout=60, what="the run to be under way")
    broker.restart()
    wait_for(lambda: worker.log().count("Connected to") >= 2, timeout=90,
             what="the worker to reconnect")  # fmt: skip
    before = len(journal)

    def settled() -> tuple[Counter[str]] | None:
        lost = broker.lost_in_transit()
        return (lost,) if ids - {e["id"] for e in journal.entries()} <= lost.keys() else None

    (lost,) = wait_for(settled, timeout=120, interval=0.5,
                       what="every task after the broker restart")  # fmt: skip
    # Every task that reached the worker ran. Redis's transport may lose a message its
    # BRPOP popped as the server stopped, before the worker had it (see the helper): one
    # per channel, and the weighted consumer has a channel per queue.
    assert sum(lost.values()) <= len(queues), f"more than one in flight per queue: {lost}"
    entries = flood.runs(journal)
    after = Counter(e["queue"] for e in entries[before : before + 200])
    print(
        f"\nafter the restart: next 200 = {dict(after)} (from run {before}); "
        f"{sum(lost.values())} lost in the Redis transport"
    )
    later = Counter(e["queue"] for e in entries[before + 200 :])
    assert later[queues[0]] and later[queues[1]], "a queue ran dry: measure earlier"
    assert 2.5 <= after[queues[0]] / after[queues[1]] <= 3.5, after
    assert worker.alive()
    # Celery logs the lost connection's tracebacks itself; none may pass through our code.
    assert "celery_extras/" not in worker.log()


def test_add_and_cancel_consumer_at_run_time(cluster: Cluster, journal: Journal) -> None:
    ns = cluster.ns
    a, b = f"{ns}.a", f"{ns}.b"
    cluster.configure(include=INCLUDE, extras_queue_weights={a: 1, b: 2})
    worker = cluster.worker("w1", queues=(a,))
    inspect = cluster.app.control.inspect(destination=[worker.hostname], timeout=3)
    publish(cluster, "b", 5, seconds=0)
    publish(cluster, "a", 1, seconds=0)
    wait_for(lambda: len(journal) >= 1, timeout=30, what="queue a's task")
    assert [e["queue"] for e in journal.entries()] == [a]  # b is not consumed yet

    cluster.app.control.add_consumer(b, destination=[worker.hostname], reply=True, timeout=5)
    wait_for(lambda: len(journal) >= 6, timeout=30, what="queue b's tasks after add_consumer")
    weights = (inspect.stats() or {})[worker.hostname]["extras_queues"]["weights"]
    assert weights == {a: 1, b: 2}  # due queues stand apart, served first

    cluster.app.control.cancel_consumer(b, destination=[worker.hostname], reply=True, timeout=5)

    def active() -> set[str]:  # Celery replies first and cancels on the event loop's next turn
        queues = (inspect.active_queues() or {}).get(worker.hostname, [])
        return {q["name"] for q in queues if not q["name"].endswith(DUE_SUFFIX)}  # (delay store)

    wait_for(lambda: active() == {a}, timeout=30, interval=0.5, what="queue b cancelled")
    publish(cluster, "b", 3, seconds=0)
    publish(cluster, "a", 1, seconds=0)
    wait_for(lambda: len(journal) >= 7, timeout=30, what="queue a's second task")
    assert Counter(e["queue"] for e in journal.entries()) == {a: 2, b: 5}
    with cluster.app.connection_for_write() as conn:
        assert conn.default_channel.queue_declare(b, passive=True).message_count == 3
