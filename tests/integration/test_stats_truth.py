"""Every way a task can end, on a real prefork worker: each counter equals the truth everywhere.

One task name per ending (success, failure, the four kinds of retry, Reject, Ignore,
revoke before start and with terminate, soft and hard time limits, a lost worker
with and without ``acks_late``, a limited task parked in the delay store), so the
truth is known per name. The worker's events, ``inspect stats``, the exporter's
``/metrics`` (parsed by prometheus_client) and ``extras top`` must all say it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from celery.utils import uuid
from prometheus_client.parser import text_string_to_metric_families

from celery_extras.stats.listener import ClusterState
from celery_extras.stats.recorder import COUNTERS
from celery_extras.stats.schema import Throughput
from tests.integration.conftest import Cluster
from tests.integration.test_stats import Service, free_port, http_get
from tests.support import proj
from tests.support.workers import ROOT, wait_for

#: Timing is asserted here (rates, latencies): under pytest-xdist these tests run alone.
pytestmark = pytest.mark.exclusive

STATS_TASKS = ("tests.support.tasks_stats",)
WINDOWS = [1, 10, 600]  # counts over 10 minutes: the whole run, however slow the machine
#: The counters ``extras top`` shows, by its column labels.
TOP_COLUMNS = {"recv": "received", "ok": "succeeded", "fail": "failed", "retry": "retried",
               "rej": "rejected", "rvk": "revoked", "rlim": "rate_limited", "park": "parked",
               "ign": "ignored"}  # fmt: skip


def truth(**per_task: dict[str, int]) -> dict[str, dict[str, int]]:
    return {name: {c: counts.get(c, 0) for c in COUNTERS} for name, counts in per_task.items()}


def retried_then_succeeded(n: int) -> dict[str, int]:
    return {"received": 2 * n, "started": 2 * n, "retried": n, "succeeded": n}


def ran(n: int, outcome: str) -> dict[str, int]:
    return {"received": n, "started": n, outcome: n}


#: The truth per task name, but for ``rate_limited``, ``parked`` and ``released`` of
#: ``tests.stats.limited`` (see below).
EXPECTED = truth(
    **{
        "tests.stats.succeeds": ran(5, "succeeded"),
        "tests.stats.fails": ran(2, "failed"),
        "tests.stats.retries_once": retried_then_succeeded(2),  # retry() without exc
        "tests.stats.retries_exc": retried_then_succeeded(2),  # retry(exc=...)
        "tests.stats.autoretries": retried_then_succeeded(2),  # autoretry_for
        "tests.stats.policy_retries": retried_then_succeeded(2),  # retry_policy
        "tests.stats.rejects": ran(2, "rejected"),
        "tests.stats.ignores": ran(2, "ignored"),
        # revoked before it was sent: received (Celery logs it), then discarded
        "tests.stats.revoked": {"received": 2, "revoked": 2},
        "tests.stats.blocks": ran(1, "revoked"),  # revoked with terminate while running
        "tests.stats.soft_limit": ran(1, "failed"),
        "tests.stats.hard_limit": ran(1, "failed"),
        "tests.stats.exits": ran(1, "failed"),  # WorkerLostError, acked early
        "tests.stats.exits_late": ran(1, "failed"),  # WorkerLostError, acks_late
        # acks_late + reject_on_worker_lost: requeued (rejected), then run again
        "tests.stats.exits_late_requeued": dict(received=2, started=2, rejected=1, succeeded=1),
        # parked in the delay store with a booked slot: received once, not once per release
        "tests.stats.limited": ran(10, "succeeded"),
    }
)
LIMITED = "tests.stats.limited"


def differences(event: Throughput | None) -> str:
    """What *event*'s totals say that :data:`EXPECTED` does not, per task and counter."""
    if event is None:
        return "no event of the worker's"
    totals = without_waits(event_totals(event))
    lines = []
    for name in sorted(EXPECTED.keys() | totals.keys()):
        want, got = EXPECTED.get(name, {}), totals.get(name, {})
        wrong = [f"{c} {got.get(c)} not {want.get(c)}"
                 for c in COUNTERS if got.get(c) != want.get(c)]  # fmt: skip
        if wrong:
            lines.append(f"{name}: {', '.join(wrong)}")
    return "; ".join(lines) or "none"


def active_ids(cluster: Cluster, hostname: str) -> set[str]:
    replies = cluster.app.control.inspect(destination=[hostname], timeout=3).active() or {}
    return {task["id"] for task in replies.get(hostname, [])}


def run_every_ending(cluster: Cluster, send: Callable[..., Any], hostname: str) -> None:
    """Send the workload of :data:`EXPECTED` to the worker *hostname*."""
    revoked_ids = [uuid() for _ in range(2)]
    assert cluster.app.control.revoke(revoked_ids, destination=[hostname], reply=True, timeout=10)
    for task_id in revoked_ids:
        send("tests.stats.revoked", task_id=task_id)
    blocked = send("tests.stats.blocks", 60)
    wait_for(lambda: blocked.id in active_ids(cluster, hostname), timeout=60,
             what="the blocking task running")  # fmt: skip
    cluster.app.control.revoke(blocked.id, terminate=True, destination=[hostname])
    for i in range(5):
        send("tests.stats.succeeds", i)
    for name in ("fails", "retries_once", "retries_exc", "autoretries", "policy_retries",
                 "rejects", "ignores"):  # fmt: skip
        for _ in range(2):
            send(f"tests.stats.{name}")
    for name in ("soft_limit", "hard_limit", "exits", "exits_late", "exits_late_requeued"):
        send(f"tests.stats.{name}")
    for i in range(10):
        send(LIMITED, i)


def counts_in(figures: dict[str, Any], window: int) -> dict[str, dict[str, int]]:
    i = figures["windows"].index(window)
    return {name: {c: task.get(c, [0] * (i + 1))[i] for c in COUNTERS}
            for name, task in figures["tasks"].items()}  # fmt: skip


def totals_in(figures: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {name: dict(task["total"]) for name, task in figures["tasks"].items()}


def event_totals(t: Throughput) -> dict[str, dict[str, int]]:
    return {name: dict(f.totals or {}) for name, f in t.tasks.items()}


def without_waits(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """*counts* without the limited task's waits (checked against the enforcer's counts)."""
    waits = {"rate_limited": 0, "parked": 0, "released": 0}
    return {name: {**row, **waits} if name == LIMITED else row
            for name, row in counts.items()}  # fmt: skip


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """A /metrics page parsed by prometheus_client: ``{sample name: {labels: value}}``."""
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(http_get(url) or ""):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def metrics_totals(
    metrics: dict[str, dict[tuple[tuple[str, str], ...], float]], worker: str
) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = {}
    for labels, value in metrics.get("celery_extras_tasks_total", {}).items():
        found = dict(labels)
        if found["worker"] == worker:
            totals.setdefault(found["task"], {})[found["state"]] = int(value)
    return totals


def top_once(cluster: Cluster, hostname: str) -> tuple[str, dict[str, dict[str, int]]]:
    """``extras top --iterations 1`` (one frame, seeded from inspect stats): its counts."""
    env = {
        **os.environ,
        "COLUMNS": "200",
        "LINES": "60",
        **proj.worker_env(cluster.broker, cluster.ns, cluster.conf, cluster.include),
    }
    argv = [sys.executable, "-m", "celery", "-A", "tests.support.proj", "extras", "top",
            "--iterations", "1", "--no-clear", "--timeout", "3"]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line.split() for line in lines if line.startswith("task "))
    labels = header[header.index("|") + 1 : -1]  # the counts, before "p95ms"
    rows: dict[str, dict[str, int]] = {}
    start = lines.index(next(line for line in lines if line.startswith(hostname)))
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        cells = line.split()
        counts = cells[cells.index("|") + 1 : -1]
        rows[cells[0]] = {TOP_COLUMNS[k]: int(v) for k, v in zip(labels, counts, strict=True)}
    return done.stdout, rows


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\b(celery_extras_[a-z_]+)", text))


def test_every_ending_is_counted_exactly_everywhere(
    cluster: Cluster, send: Callable[..., Any], listening: ClusterState
) -> None:
    """Events, inspect stats, the exporter's /metrics and extras top all say the truth."""
    cluster.configure(
        include=STATS_TASKS,
        extras_stats_interval=0.5,
        extras_stats_windows=WINDOWS,
        extras_limit_max_hold=0.1,
        extras_queue_weights={cluster.ns: 1},  # through the fair consumer: its buffer gauge
    )
    worker = cluster.worker("truth", concurrency=2, pool="prefork")
    run_every_ending(cluster, send, worker.hostname)

    def latest() -> Throughput | None:
        return listening.workers().get(worker.hostname)

    def settled() -> bool:
        t = latest()
        return t is not None and without_waits(event_totals(t)) == EXPECTED

    try:
        wait_for(settled, timeout=120, interval=0.5, what="event totals equal to the truth")
    except AssertionError as exc:  # what differed, as the last event said it
        raise AssertionError(f"{exc}; {differences(latest())}") from None
    seen = listening.received
    wait_for(lambda: listening.received >= seen + 3, timeout=30, what="three more events")
    event = latest()
    assert event is not None
    totals = event_totals(event)
    assert without_waits(totals) == EXPECTED  # nothing counted late
    windowed = {name: dict(zip(COUNTERS, (f.counts[c][-1] for c in COUNTERS), strict=True))
                for name, f in event.tasks.items()}  # fmt: skip
    assert windowed == totals  # the hour window holds the whole run

    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=5).stats()
    reply = stats[worker.hostname]
    extras = reply["extras"]
    assert totals_in(extras) == totals
    assert counts_in(extras, 600) == totals
    policies = reply["extras_policies"]
    # rate_limited: each wait the enforcer reported. A long wait leaves the worker, parked
    # in the delay store (which then releases it); a released task may be held a little
    # again, unreported
    limited = totals[LIMITED]
    parked = policies.get("parked", 0)
    assert parked > 0, f"no limited task left the worker to wait: the test is void ({policies})"
    assert parked <= limited["rate_limited"] <= policies["held"] + parked
    assert limited["parked"] == limited["released"] == parked
    for name, row in totals.items():
        every = event.tasks[name].runtime_total
        assert every is not None and every.count == row["succeeded"], name

    # the exporter: a counter equal to the truth, a histogram counting every success
    port = free_port()
    exporter = Service(cluster, "exporter", ["extras", "exporter", "--port", str(port)], {})
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(
            lambda: metrics_totals(scrape(url), worker.hostname) == totals,
            timeout=60,
            interval=0.5,
            what=f"/metrics equal to the truth; log: {exporter.log()[-2000:]}",
        )
        metrics = scrape(url)
        counts = metrics["celery_extras_task_runtime_seconds_count"]
        for name, row in totals.items():
            key = (("task", name), ("worker", worker.hostname))
            assert counts[key] == row["succeeded"], name
            every = metrics["celery_extras_task_runtime_seconds_bucket"]
            assert every[(("le", "+Inf"), *key)] == row["succeeded"], name
        store = metrics["celery_extras_store_up"]
        for capability in ("policies", "limits", "concurrency", "queue_concurrency", "coalesce",
                           "debounce", "memoize"):  # fmt: skip
            assert store[(("capability", capability), ("worker", worker.hostname))] == 1.0
        assert metrics["celery_extras_tasks_waiting"][(("worker", worker.hostname),)] == 0.0
        buffered = metrics["celery_extras_queue_buffered"]
        assert buffered[(("queue", cluster.ns), ("worker", worker.hostname))] == 0.0

        # Grafana: every query of the dashboard and the alerting rules names a scraped metric
        scraped = set(metrics)
        if cluster.broker.startswith("amqp"):  # RabbitMQ cannot tell an age (docs/queues.rst)
            scraped.add("celery_extras_queue_oldest_seconds")
        dashboard = json.loads((ROOT / "docs" / "grafana" / "celery-extras.json").read_text())
        queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
        queries += re.findall(r"expr: (?:>-\n)?((?:.|\n)*?)\n\s+for:",
                              (ROOT / "docs" / "grafana" / "alerts.yml").read_text())  # fmt: skip
        assert len(queries) >= 12
        for query in queries:
            names = metric_names(query)
            assert names and names <= scraped, (query, names - scraped)
    finally:
        exporter.stop()

    # extras top, one frame: seeded from inspect stats, the same counts
    frame, rows = top_once(cluster, worker.hostname)
    assert set(rows) == set(totals), frame
    for name, row in rows.items():
        assert row == {c: totals[name][c] for c in row}, (name, frame)
