"""Policies: cost of one acquire, and achieved rates against Celery's own ``rate_limit``.

* Local acquire: :class:`~celery_extras.TokenBucket.reserve` against kombu's
  ``TokenBucket.can_consume`` (what Celery's ``rate_limit`` uses), in microseconds.
* Global acquire: one Lua script call on loopback Redis, p50 over many calls.
* Accuracy, in one run on Redis: 3 workers with ``10/s`` (Celery: per worker;
  celery-extras: ``scope="global"``), and 1 worker with ``10/s`` and a backlog of
  100 (Celery's rate-limited messages clog the prefetch window).
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from celery import Task, shared_task
from kombu.utils.limits import TokenBucket as KombuBucket

from celery_extras import limit
from celery_extras.limits.redis_bucket import GlobalTokenBucket, LimitTake
from celery_extras.limits.spec import limit_id
from celery_extras.limits.token_bucket import TokenBucket
from tests.support import proj
from tests.support.brokers import REDIS_URL, require_broker
from tests.support.journal import Journal
from tests.support.workers import WorkerProcess, wait_for

from .table import Row

__all__ = ["measure"]

INCLUDE = ("bench.policies",)
RATE = 10.0
GLOBAL_RATE = 20.0


@shared_task(bind=True, name="bench.policies.plain10", rate_limit="10/s")
def plain10(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


@shared_task(bind=True, name="bench.policies.plain20", rate_limit="20/s")
def plain20(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


@limit("20/s", scope="global")
@shared_task(bind=True, name="bench.policies.global20")
def global20(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


@limit("100/s", scope="global")
@shared_task(bind=True, name="bench.policies.global100")
def global100(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


@limit("10/s", scope="worker")
@shared_task(bind=True, name="bench.policies.worker10")
def worker10(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


def local_acquire_us(calls: int = 200_000, plain: bool = False) -> float:
    """Median cost of one local acquire, in microseconds (rate high enough never to wait)."""
    samples = []
    for _ in range(5):
        if plain:
            kombu_bucket = KombuBucket(1e9, capacity=1e9)
            take = kombu_bucket.can_consume
        else:
            bucket = TokenBucket(1e9, burst=10**9)
            take = bucket.reserve  # type: ignore[assignment]
        start = time.perf_counter_ns()
        for _ in range(calls):
            take(1)
        samples.append((time.perf_counter_ns() - start) / calls / 1000)
    return statistics.median(samples)


def global_acquire_ms(calls: int = 3000, limits: int = 1) -> float:
    """p50 latency of one global acquire (one script call) on loopback Redis, in ms, for a
    task with *limits* global limits (the first broad, the others per key)."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    bucket = GlobalTokenBucket(client, prefix)
    takes = [LimitTake(limit_id("bench", i), "k" if i else "", 1e6, 10**6, 1, narrow=bool(i))
             for i in range(limits)]  # fmt: skip
    for _ in range(50):
        bucket.acquire("bench", takes, tagged=limits > 1)
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        bucket.acquire("bench", takes, tagged=limits > 1)
        samples.append((time.perf_counter_ns() - start) / 1e6)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()
    return statistics.median(samples)


def achieved_rate(task: str, plain: bool, workers: int, tasks: int, deadline: float) -> float:
    """Tasks/s from first to last start, over *tasks* queued for *workers* fresh workers."""
    broker = require_broker("redis")
    ns = f"b{uuid.uuid4().hex[:10]}"
    journal = Journal(ns)
    app = proj.make_app(broker, ns, {}, INCLUDE, plain)
    env = proj.worker_env(broker, ns, {}, INCLUDE, plain)
    with tempfile.TemporaryDirectory(prefix="bench-policies-") as tmp:
        procs = [
            WorkerProcess(f"w{i}", env, Path(tmp) / f"w{i}.log", concurrency=2)
            for i in range(workers)
        ]
        try:
            for w in procs:
                w.start(wait=False)
            for w in procs:
                w.wait_ready()
            for i in range(tasks):
                app.send_task(task, args=(i,))
            started = time.monotonic()
            # Celery's own limit may collapse: then measure what ran by the deadline
            with contextlib.suppress(AssertionError):
                wait_for(lambda: len(journal) >= tasks, timeout=deadline, interval=0.2)
            times = sorted(e["t"] for e in journal.entries())
            if len(times) < 2:
                return 0.0
            if len(times) < tasks:
                return len(times) / (time.monotonic() - started)
            return (len(times) - 1) / (times[-1] - times[0])
        finally:
            for w in procs:
                w.stop()
            journal.clear()
            app.control.purge()
            app.close()


def measure() -> list[Row]:
    local_plain, local_extras = local_acquire_us(plain=True), local_acquire_us()
    global_ms = global_acquire_ms()
    several_ms = [global_acquire_ms(limits=n) for n in (2, 3)]
    three_plain = achieved_rate("bench.policies.plain20", True, 3, 400, 40)
    three_extras = achieved_rate("bench.policies.global20", False, 3, 400, 40)
    one_plain = achieved_rate("bench.policies.plain10", True, 1, 200, 40)
    one_extras = achieved_rate("bench.policies.worker10", False, 1, 200, 40)
    return [
        Row("local acquire", "us", local_plain, local_extras, "<= 2", local_extras <= 2.0,
            note="kombu TokenBucket.can_consume vs TokenBucket.reserve"),
        Row("global acquire p50 (loopback Redis)", "ms", None, global_ms, "<= 0.3",
            global_ms <= 0.3, note="one Lua script call"),
        *(Row(f"global acquire p50, {n} limits on one task", "ms", None, ms, "<= 0.3",
              ms <= 0.3, note="still one script call: every limit booked together")
          for n, ms in zip((2, 3), several_ms, strict=True)),
        Row("3 workers, 20/s, 400 queued: cluster rate", "tasks/s", three_plain, three_extras,
            "20 +- 5%", abs(three_extras - GLOBAL_RATE) <= 0.05 * GLOBAL_RATE,
            note="Celery rate_limit is per worker; extras scope=global"),
        Row("1 worker, 10/s, 200 queued: rate", "tasks/s", one_plain, one_extras,
            "10 +- 5%", abs(one_extras - RATE) <= 0.05 * RATE,
            note="Redis broker; plain: what ran within 40 s"),
    ]  # fmt: skip
