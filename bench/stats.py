"""Stats: cost of recording one task event, and no-op task throughput with stats on.

* Recording: ``Recorder.count`` over 100 task names, median of many batches.
* Throughput: a prefork worker (concurrency 2) drains a backlog of no-op tasks;
  plain Celery and celery-extras (every capability installed, no policy on the
  task) take turns in one run, and the medians are compared. The drain ends when
  the last task's result arrives (the worker is not polled while it drains).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from pathlib import Path

from celery import Celery

from celery_extras.stats.recorder import RECEIVED, Recorder
from tests.support import proj
from tests.support.brokers import BROKERS, require_broker
from tests.support.workers import WorkerProcess, wait_for

from .table import Row

__all__ = ["measure"]

TASK = "tests.stats.succeeds"
INCLUDE = ("tests.support.tasks_stats",)
BACKLOG = 5000
ROUNDS = 5


def record_cost_us(names: int = 100, batches: int = 300, per_batch: int = 1000) -> float:
    """Median cost of one ``Recorder.count`` call, in microseconds."""
    recorder = Recorder()
    task_names = [f"bench.task.{i}" for i in range(names)]
    for name in task_names:
        recorder.count(name, RECEIVED)
    count = recorder.count
    calls = [task_names[i % names] for i in range(per_batch)]
    samples = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for name in calls:
            count(name, RECEIVED)
        samples.append((time.perf_counter_ns() - start) / per_batch / 1000)
    return statistics.median(samples)


def _total(app: Celery, worker: WorkerProcess) -> int:
    stats = app.control.inspect(destination=[worker.hostname], timeout=2).stats()
    if not stats or worker.hostname not in stats:
        return -1
    return int(stats[worker.hostname].get("total", {}).get(TASK, 0))


def drain_rate(broker: str, plain: bool, logdir: Path) -> float:
    """Tasks/s of one worker draining a backlog of :data:`BACKLOG` no-op tasks."""
    ns = f"b{uuid.uuid4().hex[:10]}"
    conf = {"worker_prefetch_multiplier": 16}
    app = proj.make_app(broker, ns, conf, INCLUDE, plain=plain)
    env = proj.worker_env(broker, ns, conf, INCLUDE, plain=plain)
    worker = WorkerProcess("bench", env, logdir / f"{ns}.log", concurrency=2)
    try:
        worker.start()
        for i in range(100):  # warm up the pool
            app.send_task(TASK, args=(i,), ignore_result=True)
        wait_for(lambda: _total(app, worker) >= 100, timeout=60, what="warm-up")
        app.control.cancel_consumer(ns, destination=[worker.hostname], reply=True, timeout=5)
        for i in range(BACKLOG - 1):
            app.send_task(TASK, args=(i,), ignore_result=True)
        last = app.send_task(TASK, args=("last",))
        start = time.monotonic()
        app.control.add_consumer(ns, destination=[worker.hostname], reply=True, timeout=5)
        # The end is the last task's result, read from the result backend: polling the worker
        # itself (inspect) while it drains would load the very process being measured.
        last.get(timeout=300)
        elapsed = time.monotonic() - start
        wait_for(lambda: _total(app, worker) >= 100 + BACKLOG, timeout=60, interval=0.2,
                 what="every task of the backlog")  # fmt: skip
        return BACKLOG / elapsed
    finally:
        worker.stop()
        app.close()


def measure() -> list[Row]:
    rows = []
    cost = record_cost_us()
    rows.append(
        Row("stats: record one task event (100 names)", "us", None, cost, "<= 1.5 us",
            cost <= 1.5, runs=300)
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-stats-") as tmp:
        for name in BROKERS:
            broker = require_broker(name)
            plain, extras = [], []
            for _ in range(ROUNDS):
                plain.append(drain_rate(broker, True, Path(tmp)))
                extras.append(drain_rate(broker, False, Path(tmp)))
            p, e = statistics.median(plain), statistics.median(extras)
            rows.append(
                Row(f"stats: no-op tasks drained, prefork c=2, {name}", "tasks/s", p, e,
                    ">= 0.97x plain", e >= 0.97 * p, runs=ROUNDS)
            )  # fmt: skip
    return rows
