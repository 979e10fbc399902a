"""Throughput statistics on real prefork workers: exact counts in events and inspect stats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

import celery
import pytest
from celery.result import AsyncResult
from celery.utils import uuid
from kombu import Exchange

from celery_extras.stats.listener import ClusterState
from celery_extras.stats.recorder import COUNTERS
from celery_extras.stats.schema import Throughput
from tests.integration.conftest import Cluster
from tests.support import proj
from tests.support.brokers import free_port
from tests.support.workers import ROOT, wait_for

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
        # revoked before it was sent: received (Celery logs it), then discarded
        "tests.stats.revoked": {"received": 3, "revoked": 3},
    }
)


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


#: Celery 5.7 stores a FAILURE for a task that rejects its message without requeue; 5.5 and
#: 5.6 store nothing (the result stays PENDING), so only 5.7's can be waited for.
REJECT_STORES_FAILURE = tuple(int(p) for p in celery.__version__.split(".")[:2]) >= (5, 7)


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
    rejected = [send("tests.stats.rejects") for _ in range(2)]
    revoked = [send("tests.stats.revoked", task_id=i) for i in revoked_ids]
    for result in results:
        result.get(timeout=60, propagate=False)
    states = sorted(r.state for r in results)
    assert states == sorted(["SUCCESS"] * 13 + ["FAILURE"] * 4), states
    if REJECT_STORES_FAILURE:
        for r in rejected:
            assert r.get(timeout=60, propagate=False) is not None and r.state == "FAILURE"
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


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_threads_and_solo_pools_count_the_truth(
    cluster: Cluster, send: Callable[..., Any], pool: str
) -> None:
    """The threads pool calls back from its threads (4 here), solo from inside the strategy."""
    cluster.configure(include=STATS_TASKS)
    worker = cluster.worker(f"stats-{pool}", concurrency=4, pool=pool)
    more = [send("tests.stats.succeeds", i) for i in range(300)]
    run_known_workload(cluster, send, worker.hostname)
    # polled, not get(): on Celery 5.5, get() of a result stored before it subscribed
    # waits a second for the pub/sub message it missed (293 s for these 300)
    wait_for(lambda: all(r.ready() for r in more), timeout=60, interval=0.5,
             what="the 300 more results")  # fmt: skip
    assert {r.state for r in more} == {"SUCCESS"}
    succeeds = {"received": 310, "started": 310, "succeeded": 310}
    expected = {**EXPECTED, **truth(**{"tests.stats.succeeds": succeeds})}

    def extras() -> dict[str, Any]:
        stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=5).stats()
        figures: dict[str, Any] = (stats or {}).get(worker.hostname, {}).get("extras", {})
        return figures

    wait_for(lambda: (f := extras()) and counts_in(f, 3600) == expected, timeout=60,
             what=f"inspect stats equal to the truth; last: {extras()}")  # fmt: skip
    runtimes = extras()["tasks"]["tests.stats.succeeds"]["runtime"]
    assert runtimes["count"] == 310


class Service:
    """A ``celery -A tests.support.proj ...`` process in its own session, always stopped."""

    def __init__(self, cluster: Cluster, name: str, args: list[str], extra_env: dict[str, str]):
        self.log_path = cluster.logdir / f"{name}.log"
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **proj.worker_env(cluster.broker, cluster.ns, cluster.conf, cluster.include),
            **extra_env,
        }
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.support.proj", *args],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def http_get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: bytes = response.read()
            return body.decode()
    except OSError:
        return None


def metric(text: str | None, name: str, **labels: str) -> float | None:
    """The value of the sample *name* whose labels include *labels*, from /metrics text."""
    for line in (text or "").splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        sample, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in sample for k, v in labels.items()):
            return float(value)
    return None


def send_malformed_events(cluster: Cluster) -> int:
    """Publish bad worker-throughput events; return how many events should be counted."""
    app = cluster.app
    bad_events: list[dict[str, Any]] = [
        {"windows": [1, 10]},  # no tasks
        {"windows": "all", "tasks": {}},
        {"windows": [1], "tasks": {"x": {"received": ["1"]}}},
        {"windows": [1], "tasks": {f"t{i}": {} for i in range(20_000)}},  # huge
        {"windows": [1], "tasks": {"y" * 100_000: {}}},
    ]
    with app.connection_for_write() as conn:
        dispatcher = app.events.Dispatcher(conn, hostname="evil@stats-test", enabled=True)
        for fields in bad_events:
            dispatcher.send("worker-throughput", **fields)
        dispatcher.close()
        exchange = Exchange(app.conf.event_exchange, type="topic")
        with conn.Producer() as producer:  # not even events
            producer.publish(
                ["garbage", {"type": "worker-throughput", "clock": "x"}],
                exchange=exchange,
                routing_key="worker.throughput",
                serializer="json",
                declare=[exchange],
                # Celery's own gossip consumer (in every worker) reads the sender from this
                # header; without it, it crashes the worker's consumer on a non-dict body
                headers={"hostname": "evil@stats-test"},
            )
    return len(bad_events) + 2


def test_flower_exporter_and_top_show_the_figures_and_survive_bad_events(
    cluster: Cluster, send: Callable[..., Any]
) -> None:
    cluster.configure(include=STATS_TASKS, extras_stats_interval=0.5)
    worker = cluster.worker("stats2", concurrency=2)
    results = [send("tests.stats.succeeds", i) for i in range(5)]
    results += [send("tests.stats.fails") for _ in range(2)]
    for result in results:
        result.get(timeout=60, propagate=False)

    flower_port, exporter_port = free_port(), free_port()
    flowerconfig = cluster.logdir / "flowerconfig.py"
    flowerconfig.write_text("from celery_extras.stats.prometheus import in_flower; in_flower()\n")
    services = []
    try:
        flower = Service(
            cluster,
            "flower",
            ["flower", f"--port={flower_port}", "--address=127.0.0.1", f"--conf={flowerconfig}"],
            {"FLOWER_UNAUTHENTICATED_API": "true"},
        )
        services.append(flower)
        exporter = Service(
            cluster, "exporter", ["extras", "exporter", "--port", str(exporter_port)], {}
        )
        services.append(exporter)
        top = Service(cluster, "top", ["extras", "top", "--refresh", "0.5", "--no-clear"], {})
        services.append(top)
        flower_metrics = f"http://127.0.0.1:{flower_port}/metrics"
        exporter_metrics = f"http://127.0.0.1:{exporter_port}/metrics"
        labels = {"worker": worker.hostname, "task": "tests.stats.succeeds", "window": "3600"}

        def figures_everywhere() -> bool:
            for url in (flower_metrics, exporter_metrics):
                text = http_get(url)
                ok = metric(text, "celery_extras_window_tasks", state="succeeded", **labels)
                failed = metric(
                    text, "celery_extras_window_tasks",
                    **{**labels, "task": "tests.stats.fails"}, state="failed",
                )  # fmt: skip
                if (ok, failed) != (5.0, 2.0):
                    return False
            return f"  {worker.hostname}" not in top.log() and worker.hostname in top.log()

        wait_for(
            figures_everywhere, timeout=90, interval=0.5, what="figures in flower/exporter/top"
        )

        # Flower's workers API shows the worker's inspect stats, with the figures under extras
        def flower_workers() -> dict[str, Any] | None:
            body = http_get(f"http://127.0.0.1:{flower_port}/api/workers?refresh=1")
            if not body:
                return None
            stats = json.loads(body).get(worker.hostname, {}).get("stats", {})
            extras: dict[str, Any] | None = stats.get("extras")
            # Flower answers from its cache when an inspect is slow, and an inspect that
            # came within a second of a task's end has it only in the second being filled
            names = ("tests.stats.succeeds", "tests.stats.fails")
            if extras is None or not set(names) <= set(extras["tasks"]):
                return None
            counts = counts_in(extras, 3600)
            ended = counts[names[0]]["succeeded"], counts[names[1]]["failed"]
            return extras if ended == (5, 2) else None

        extras = wait_for(flower_workers, timeout=60, interval=1,
                          what="flower /api/workers with 5 succeeded and 2 failed")  # fmt: skip
        assert counts_in(extras, 3600)["tests.stats.succeeds"] == {
            **dict.fromkeys(COUNTERS, 0), "received": 5, "started": 5, "succeeded": 5,
        }  # fmt: skip

        sent = send_malformed_events(cluster)

        def all_counted() -> bool:
            counted = [
                metric(http_get(url), "celery_extras_malformed_events_total")
                for url in (flower_metrics, exporter_metrics)
            ]
            return counted == [sent, sent] and f"malformed events: {sent}" in top.log()

        wait_for(all_counted, timeout=60, interval=0.5, what=f"{sent} malformed events counted")
        assert all(s.alive() for s in services), [s.log()[-2000:] for s in services]
        # still serving the figures after the bad events, and logged once per sender
        text = http_get(exporter_metrics)
        assert metric(text, "celery_extras_window_tasks", state="succeeded", **labels) == 5.0, text
        assert exporter.log().count("dropped a malformed worker-throughput event from") == 2
        assert "tests.stats.succeeds" in top.log()
    finally:
        for service in services:
            service.stop()
