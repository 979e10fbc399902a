"""Queue figures (issue 54): depth on the broker, age of the oldest message, buffered.

Real workers on both brokers: 25 messages sent to a declared queue no worker consumes show
in the exporter as ``celery_extras_queue_depth{queue="agecheck"} 25``, with their age on
Redis (RabbitMQ cannot tell it), in ``inspect stats`` and in ``extras top``. On a private
Redis broker, the cost: one ``EVAL`` per queue per stats tick, counted by the server.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from kombu import Exchange, Queue

from celery_extras.delay.parking import Parker
from tests.integration.conftest import Cluster
from tests.integration.test_delay_purge import celery
from tests.integration.test_stats import Service, free_port, http_get, metric
from tests.support.brokers import PrivateRedis
from tests.support.workers import ROOT, wait_for
from tests.unit.test_delay_core import make_entry

STATS_TASKS = ("tests.support.tasks_stats",)
AGECHECK = "agecheck"


EXAMPLES = Path(ROOT) / "docs" / "examples" / "queues"
_SELECTOR = re.compile(r"(celery_extras_\w+)\{(\w+)(?:=|!=)")


def referenced_metrics() -> set[tuple[str, tuple[str, ...]]]:
    """``(metric, label names)`` the KEDA, HPA and prometheus-adapter examples of
    ``docs/queues.rst`` ask the exporter for."""
    keda = yaml.safe_load((EXAMPLES / "keda-scaledobject.yaml").read_text())
    hpa = yaml.safe_load((EXAMPLES / "hpa.yaml").read_text())
    adapter = yaml.safe_load((EXAMPLES / "prometheus-adapter.yaml").read_text())
    queries = [t["metadata"]["query"] for t in keda["spec"]["triggers"]]
    queries += [rule["seriesQuery"] for rule in adapter["rules"]["external"]]
    found = {(m[1], (m[2],)) for q in queries for m in _SELECTOR.finditer(q)}
    for entry in hpa["spec"]["metrics"]:
        metric = entry["external"]["metric"]
        found.add((metric["name"], tuple(sorted(metric["selector"]["matchLabels"]))))
    return found


def _queues(ns: str) -> dict[str, dict[str, str]]:
    return {
        ns: {"exchange": ns, "routing_key": ns},
        AGECHECK: {"exchange": ns, "routing_key": AGECHECK},
    }


def _empty_agecheck(cluster: Cluster) -> None:
    """The queue's leftovers of an earlier run (its name is not namespaced) dropped."""
    with cluster.app.connection_for_write() as conn:
        queue = Queue(AGECHECK, Exchange(cluster.ns), routing_key=AGECHECK)(conn.default_channel)
        queue.declare()
        queue.purge()


def test_exporter_shows_depth_and_age_of_an_unconsumed_queue(cluster: Cluster) -> None:
    cluster.configure(include=STATS_TASKS, extras_stats_interval=0.5,
                      task_queues=_queues(cluster.ns))  # fmt: skip
    _empty_agecheck(cluster)
    worker = cluster.worker("qf1", concurrency=1, queues=[cluster.ns])
    for i in range(25):
        cluster.app.send_task("tests.stats.succeeds", (i,), queue=AGECHECK)
    sent = time.time()
    port = free_port()
    exporter = Service(cluster, "exporter", ["extras", "exporter", "--port", str(port)], {})
    top = Service(cluster, "top", ["extras", "top", "--refresh", "0.5", "--no-clear"], {})
    redis_broker = cluster.broker.startswith("redis")
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def shown() -> str | None:
            text = http_get(url)
            if metric(text, "celery_extras_queue_depth", queue=AGECHECK) != 25.0:
                return None
            if metric(text, "celery_extras_queue_depth", queue=cluster.ns) != 0.0:
                return None
            oldest = metric(text, "celery_extras_queue_oldest_seconds", queue=AGECHECK)
            if redis_broker and (oldest is None or time.time() - sent < 2.5 or oldest < 2.0):
                return None
            return text

        text = wait_for(shown, timeout=60, interval=0.5, what="agecheck's figures exported")
        oldest = metric(text, "celery_extras_queue_oldest_seconds", queue=AGECHECK)
        if redis_broker:
            assert oldest is not None and 2.0 <= oldest <= time.time() - sent + 1.0
        else:  # RabbitMQ tells no message's age without taking it
            assert oldest is None
        assert metric(text, "celery_extras_queue_prefetched", worker=worker.hostname,
                      queue=AGECHECK) == 0.0  # fmt: skip

        # what the docs' KEDA, HPA and prometheus-adapter examples ask for is there
        asked = referenced_metrics()
        assert {name for name, _ in asked} == {
            "celery_extras_queue_depth",
            "celery_extras_queue_oldest_seconds",
        }
        for name, labels in asked:
            if redis_broker or name != "celery_extras_queue_oldest_seconds":
                assert metric(text, name, **dict.fromkeys(labels, AGECHECK)) is not None, name

        figures = cluster.stats(worker.hostname)["extras_queue_figures"]["queues"]
        assert figures[AGECHECK]["depth"] == 25 and figures[AGECHECK]["buffered"] == 0
        assert ("oldest" in figures[AGECHECK]) is redis_broker
        wait_for(lambda: f"{AGECHECK}" in top.log() and "25" in top.log(), timeout=30,
                 what="agecheck in extras top")  # fmt: skip
    finally:
        exporter.stop()
        top.stop()
    assert worker.alive()


def _evals(client: Any, command: str = "eval") -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_one_broker_read_per_queue_per_stats_tick(cluster: Cluster, tmp_path: Any) -> None:
    """On a Redis of the test's own, the server counts the reads: one ``EVAL`` per queue
    per tick (3 queues here: the two consumed and the declared one), and one ``HGETALL``
    of the delay store's parked counts per shard per tick (the store lives there too, in
    one shard), whatever the store holds (40 entries parked here)."""
    private = PrivateRedis(tmp_path).start()
    try:
        cluster.broker = private.url
        queues = {
            **_queues(cluster.ns),
            f"{cluster.ns}.b": {"exchange": cluster.ns, "routing_key": f"{cluster.ns}.b"},
        }
        cluster.configure(include=STATS_TASKS, extras_stats_interval=0.5, task_queues=queues)
        worker = cluster.worker("qf2", concurrency=1, queues=[cluster.ns, f"{cluster.ns}.b"])
        client = redis.Redis.from_url(private.url)

        def reads() -> int:
            figures = cluster.stats(worker.hostname).get("extras_queue_figures") or {}
            count: int = figures.get("reads", 0)
            return count

        wait_for(lambda: reads() >= 3, timeout=30, what="a first reading")
        shown = cluster.stats(worker.hostname)["extras_queue_figures"]["queues"]
        assert sorted(shown) == sorted(queues), shown
        store = Parker(cluster.app).store
        for i in range(40):
            store.park(f"e{i}", make_entry(f"t{i}"), 3600.0)  # counted for queue "q"

        def store_reads() -> int:
            count: int = cluster.stats(worker.hostname)["extras_queue_figures"]["store_reads"]
            return count

        before_reads, before_evals, started = reads(), _evals(client), time.monotonic()
        before_store, before_hgetall = store_reads(), _evals(client, "hgetall")
        wait_for(lambda: reads() >= before_reads + 30, timeout=60, what="ten more ticks")
        after_evals, after_reads = _evals(client), reads()
        after_store, after_hgetall = store_reads(), _evals(client, "hgetall")
        elapsed = time.monotonic() - started
        ticks = (after_reads - before_reads) / 3
        print(f"\nqueue figures cost: {after_evals - before_evals} EVAL for "
              f"{after_reads - before_reads} reads of 3 queues over {elapsed:.1f} s "
              f"({ticks:.0f} ticks of 0.5 s)")  # fmt: skip
        assert after_reads % 3 == 0 and before_reads % 3 == 0
        # each read is one EVAL; the only others are readings that ended between the two asks
        assert 0 <= (after_evals - before_evals) - (after_reads - before_reads) <= 3
        assert ticks <= elapsed / 0.5 + 2
        print(f"parked counts cost: {after_hgetall - before_hgetall} HGETALL for "
              f"{after_store - before_store} store reads (1 shard)")  # fmt: skip
        assert after_store - before_store >= 10
        assert 0 <= (after_hgetall - before_hgetall) - (after_store - before_store) <= 2
    finally:
        cluster.stop()
        private.stop()


#: Seconds ahead the countdown tasks are due: parked at once (threshold 1 s), and counted in
#: the exporter well before a worker takes them, even on a loaded machine.
PARKED_AHEAD = 20


def _gate(cluster: Cluster, hostname: str) -> dict[str, Any]:
    gate: dict[str, Any] = cluster.stats(hostname).get("extras_delay_gate", {})
    return gate


def test_exporter_shows_what_the_delay_store_holds_per_queue(cluster: Cluster) -> None:
    """7 countdown tasks parked for one queue and 3 for another show as
    ``celery_extras_queue_parked{queue=...} 7`` and ``3`` (and in ``inspect stats`` and
    ``extras top``), then 0 once a worker took them; 2 more, purged with ``celery purge
    -Q``, go from 2 to 0 as well."""
    other = f"{cluster.ns}.b"
    queues = {**_queues(cluster.ns), other: {"exchange": cluster.ns, "routing_key": other}}
    cluster.configure(include=STATS_TASKS, extras_stats_interval=0.5, task_queues=queues,
                      extras_eta_store=True, extras_eta_threshold=1.0)  # fmt: skip
    worker = cluster.worker("qp1", concurrency=2, queues=[cluster.ns, other])
    port = free_port()
    exporter = Service(cluster, "exporter", ["extras", "exporter", "--port", str(port)], {})
    top = Service(cluster, "top", ["extras", "top", "--refresh", "0.5", "--no-clear"], {})
    url = f"http://127.0.0.1:{port}/metrics"

    def parked(expected: dict[str, float]) -> str | None:
        text = http_get(url)
        shown = {q: metric(text, "celery_extras_queue_parked", queue=q) for q in expected}
        return text if shown == expected else None

    try:
        wait_for(lambda: parked({cluster.ns: 0.0, other: 0.0}), timeout=60, interval=0.5,
                 what="parked 0 exported before any task")  # fmt: skip
        sent = time.monotonic()
        for i in range(7):
            cluster.app.send_task("tests.stats.succeeds", (i,), queue=cluster.ns,
                                  countdown=PARKED_AHEAD)  # fmt: skip
        for i in range(3):
            cluster.app.send_task("tests.stats.succeeds", (i,), queue=other,
                                  countdown=PARKED_AHEAD)  # fmt: skip
        text = wait_for(lambda: parked({cluster.ns: 7.0, other: 3.0}), timeout=60,
                        interval=0.3, what="parked 7 and 3 exported")  # fmt: skip
        assert time.monotonic() - sent < PARKED_AHEAD, "counted too late to tell"
        assert metric(text, "celery_extras_queue_parked", queue=cluster.ns) == 7.0
        assert metric(text, "celery_extras_queue_parked", queue=other) == 3.0
        figures = cluster.stats(worker.hostname)["extras_queue_figures"]["queues"]
        assert (figures[cluster.ns]["parked"], figures[other]["parked"]) == (7, 3)
        assert figures[AGECHECK]["parked"] == 0
        wait_for(lambda: re.search(rf"{re.escape(other)}\s+\d+\s+\S+\s+3\s", top.log()),
                 timeout=30, what="parked 3 in extras top")  # fmt: skip

        wait_for(lambda: _gate(cluster, worker.hostname).get("taken") == 10,
                 timeout=PARKED_AHEAD + 90, interval=0.5, what="the 10 taken and run")  # fmt: skip
        wait_for(lambda: parked({cluster.ns: 0.0, other: 0.0}), timeout=30, interval=0.3,
                 what="parked 0 once taken")  # fmt: skip

        for i in range(2):
            cluster.app.send_task("tests.stats.succeeds", (i,), queue=cluster.ns,
                                  countdown=3600)  # fmt: skip
        wait_for(lambda: parked({cluster.ns: 2.0, other: 0.0}), timeout=60, interval=0.3,
                 what="parked 2 exported")  # fmt: skip
        done = celery(cluster, "purge", "-f", "-Q", cluster.ns)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: parked({cluster.ns: 0.0, other: 0.0}), timeout=30, interval=0.3,
                 what="parked 0 once purged")  # fmt: skip
        assert _gate(cluster, worker.hostname)["taken"] == 10
    finally:
        exporter.stop()
        top.stop()
    assert worker.alive()
