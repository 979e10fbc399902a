"""Priorities on Redis: highs behind a backlog, drain throughput, and what wider ranges cost.

Plain Celery (kombu's four steps ``[0, 3, 6, 9]``, the order fixed when a message is
prefetched) and celery-extras with ``extras_priority`` (ten levels, the order chosen when a
pool process frees), one after the other in one run:

* Start delay: one worker (prefork, concurrency 2, default prefetch) behind a backlog of
  10,000 lows (priority 9, 50 ms each); once it runs them, 100 highs (priority 0) are sent
  50 ms apart; the p50 and p99 of their delay from publish to start.
* Drain: no-op tasks of priorities 0-9 in turn, drained by a warmed worker (concurrency 2),
  alternating pairs of drains as ``bench.stats`` does; tasks per second.
* Levels: one message pushed and popped on the store as kombu's Redis transport does it
  (``LPUSH`` to the level's list, ``BRPOP`` over every level's list) with 10 and with 256
  levels, and on one sorted set scored ``level * 2**32 + counter`` (BullMQ's way): the
  cost per message, which says whether levels beyond 9 are worth building.

``python -m bench priority`` runs it (``--pairs N`` for fewer drains).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from tests.support.brokers import REDIS_URL, require_broker
from tests.support.workers import WorkerProcess, wait_for

from .runs import Cluster, cpu_seconds, send_each
from .stats import Drainer, alternate, pair_ratios
from .table import Row

__all__ = ["measure"]

BACKLOG = 10_000
HIGHS = 100
LOW_SECONDS = 0.05
DRAIN = 1500
PAIRS = 10
SLEEP = "tests.sleep"
WAITING = 100  # requests waiting in the worker while the in-process cost is measured


def start_delays(plain: bool) -> list[float]:
    """Publish-to-start delays of :data:`HIGHS` highs sent 50 ms apart behind a backlog."""
    conf: dict[str, Any] = {"task_ignore_result": True}
    if not plain:
        conf["extras_priority"] = True
    with Cluster((), conf, plain) as run:
        args = ((LOW_SECONDS, ["low", i]) for i in range(BACKLOG))
        send_each(run.app, SLEEP, args, priority=9)
        run.start("w", concurrency=2).wait_ready()
        wait_for(lambda: len(run.journal) >= 4, timeout=60, what="the lows to run")
        sent = {}
        for i in range(HIGHS):
            run.app.send_task(SLEEP, args=(0, ["high", i]), priority=0)
            sent[i] = time.time()
            time.sleep(0.05)

        def highs() -> dict[int, float]:
            return {e["tag"][1]: e["t"] for e in run.journal.entries() if e["tag"][0] == "high"}

        wait_for(lambda: len(highs()) >= HIGHS, timeout=120, interval=0.2, what="the highs")
        return [at - sent[i] for i, at in highs().items()]


class PriorityDrainer(Drainer):
    """A drainer whose backlog has priorities 0-9 in turn; it also counts the CPU time its
    worker's main process spends per task (what limits a no-op drain, and what a loaded
    machine moves far less than the drain's wall-clock rate)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cpu: list[float] = []  # main-process CPU microseconds per task, per drain

    def queue(self, tasks: int, task: str = "bench.noop") -> Any:
        for i in range(tasks - 1):
            self.app.send_task(task, args=(i,), ignore_result=True, priority=i % 10)
        return self.app.send_task(task, args=("last",), priority=9)

    def drain(self, tasks: int, other: WorkerProcess, task: str = "bench.noop") -> float:
        before = cpu_seconds(self.worker.pid)
        elapsed = super().drain(tasks, other, task)
        self.cpu.append((cpu_seconds(self.worker.pid) - before) / tasks * 1e6)
        return elapsed


def drains(pairs: int, logdir: Path) -> tuple[Drainer, Drainer]:
    """Plain and extras drainers after *pairs* alternating pairs of drains of :data:`DRAIN`."""
    broker = require_broker("redis")
    plain = PriorityDrainer(broker, True, logdir)
    extras = PriorityDrainer(broker, False, logdir, conf={"extras_priority": True})
    return alternate(plain, extras, pairs, DRAIN)


def level_cost_us(levels: int, rounds: int = 2000) -> float:
    """Microseconds per message pushed and popped as kombu does, over *levels* lists."""
    client = redis.Redis.from_url(REDIS_URL)
    ns = f"bl{uuid.uuid4().hex[:8]}"
    keys = [f"{ns}:{level}" for level in range(levels)]
    try:
        start = time.perf_counter()
        for i in range(rounds):
            client.lpush(keys[i % levels], "m")
            client.brpop(keys, timeout=1)
        return (time.perf_counter() - start) / rounds * 1e6
    finally:
        client.delete(*keys)
        client.close()


def sorted_set_cost_us(rounds: int = 2000) -> float:
    """Microseconds per message added and popped on one sorted set (BullMQ's scores)."""
    client = redis.Redis.from_url(REDIS_URL)
    key = f"bz{uuid.uuid4().hex[:8]}"
    try:
        start = time.perf_counter()
        for i in range(rounds):
            client.zadd(key, {f"m{i}": (i % 256) * 2**32 + i})
            client.bzpopmin(key, timeout=1)
        return (time.perf_counter() - start) / rounds * 1e6
    finally:
        client.delete(key)
        client.close()


def dispatch_cost_us(ordered: bool, tasks: int = 50_000) -> float:
    """Microseconds per request that waits for a process in the worker's semaphore and is
    handed on when one frees, :data:`WAITING` waiting: Celery's list (a deque), or
    priority's (*ordered*: the heap, and the prefetch window widened and narrowed through
    kombu's ``QoS``, updated as Celery's event loop does after each step)."""
    from types import SimpleNamespace

    from kombu import Connection, Consumer, Queue
    from kombu.asynchronous.semaphore import LaxBoundedSemaphore
    from kombu.common import QoS

    from celery_extras import compat
    from celery_extras.priority.buffer import PriorityBuffer
    from celery_extras.priority.waiting import PriorityWaiters, level_function

    semaphore = LaxBoundedSemaphore(1)
    with Connection("memory://") as connection:
        qos = QoS(Consumer(connection.channel(), [Queue("q")]).qos, 4)
        if ordered:
            level_of = level_function("redis", {})
            assert level_of is not None
            consumer = SimpleNamespace(qos=qos)
            waiters = PriorityWaiters(PriorityBuffer(), level_of, lambda: consumer, None)
            compat.order_semaphore_waiting(semaphore, waiters)
        requests = [SimpleNamespace(delivery_info={"priority": i % 10, "routing_key": "q"})
                    for i in range(tasks)]  # fmt: skip
        semaphore.acquire(lambda r: None, None)
        for request in requests[:WAITING]:  # the steady state: a window's worth waits
            semaphore.acquire(lambda r: None, request)
        start = time.perf_counter()
        for request in requests[WAITING:]:
            semaphore.acquire(lambda r: None, request)
            if qos.prev != qos.value:  # Celery's loop, once per turn
                qos.update()
            semaphore.release()
            if qos.prev != qos.value:
                qos.update()
        return (time.perf_counter() - start) / (tasks - WAITING) * 1e6


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _delay_rows() -> list[Row]:
    plain, extras = start_delays(True), start_delays(False)
    rows = []
    for q in (50, 99):
        p, e = _pct(plain, q), _pct(extras, q)
        rows.append(
            Row(f"priority: p{q} start delay of a 0 behind 10,000 busy 9s", "s", p, e,
                "<= 0.5x plain", e <= 0.5 * p, runs=HIGHS,
                note="prefork c=2, default prefetch, lows of 50 ms, redis")
        )  # fmt: skip
    return rows


def _drain_rows(pairs: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-priority-") as tmp:
        plain, extras = drains(pairs, Path(tmp))
    assert isinstance(plain, PriorityDrainer) and isinstance(extras, PriorityDrainer)
    plain_cpu, extras_cpu = statistics.median(plain.cpu), statistics.median(extras.cpu)
    return [
        Row("priority: no-op tasks of priorities 0-9 drained, prefork c=2, redis", "tasks/s",
            plain.rate, extras.rate, "-", True, runs=pairs,
            note=pair_ratios(plain.rates, extras.rates)),
        Row("priority: main-process CPU per no-op task of that drain", "us", plain_cpu,
            extras_cpu, "<= plain / 0.95", extras_cpu <= plain_cpu / 0.95, runs=pairs,
            note="throughput = 1 / this while the main process is the limit"),
    ]  # fmt: skip


def _cost_rows() -> list[Row]:
    celery_us, ordered_us = dispatch_cost_us(False), dispatch_cost_us(True)
    ten, wide, zset = level_cost_us(10), level_cost_us(256), sorted_set_cost_us()
    return [
        Row("priority: a request waiting for a process, in-process (no I/O)", "us", celery_us,
            ordered_us, "<= 30 us", ordered_us <= 30, runs=50_000,
            note=f"Celery's deque vs the heap and window, through kombu's semaphore, "
                 f"{WAITING} waiting"),
        Row("priority: push+pop one message, 256 lists vs kombu's 10", "us", ten, wide,
            "-", True, runs=2000, note=f"one sorted set, 256 levels: {zset:.0f} us"),
    ]  # fmt: skip


def measure(options: list[str] | None = None) -> list[Row]:
    """Every part (``--parts delays,drain,cost`` for some; ``--pairs N`` drains)."""
    options = options or []
    pairs = int(options[options.index("--pairs") + 1]) if "--pairs" in options else PAIRS
    parts = options[options.index("--parts") + 1] if "--parts" in options else "delays,drain,cost"
    rows = []
    if "delays" in parts:
        rows += _delay_rows()
    if "drain" in parts:
        rows += _drain_rows(pairs)
    if "cost" in parts:
        rows += _cost_rows()
    return rows


if __name__ == "__main__":
    from .table import render

    print(render(measure()))
