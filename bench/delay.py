"""Delay store: cost per parked task, and countdowns beyond the visibility timeout.

* Cost: the store work a parked task adds in the worker's main process (park, the
  mover's claim and release, take), in Redis round trips and microseconds, on
  loopback Redis.
* Countdowns: 300 tasks with countdowns of 15 to 35 s on Redis with a 10 s
  ``visibility_timeout``: how many ran more than once, and the main process's peak RSS,
  plain Celery beside celery-extras with ``extras_eta_store``.
* Backlog: 3,000 tasks limited to 40/s on one worker, ``acks_late``, visibility timeout
  20 s: Celery's ``rate_limit`` beside ``limit()`` with the delay store (rate over the
  run, duplicates).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import redis
from celery import Task, shared_task

from celery_extras import limit
from celery_extras.delay.core import Take
from celery_extras.delay.entry import Entry
from celery_extras.delay.redis_store import RedisDelayStore, delay_keys
from tests.support import proj
from tests.support.brokers import REDIS_URL, require_broker
from tests.support.journal import Journal
from tests.support.workers import WorkerProcess, wait_for

from .table import Row

__all__ = ["measure"]

INCLUDE = ("bench.delay",)
SHORT_VISIBILITY = {"visibility_timeout": 10, "unacked_restore_interval": 2,
                    "unacked_restore_throttle": 1}  # fmt: skip


@shared_task(bind=True, name="bench.delay.countdown", acks_late=True)
def countdown(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


@shared_task(bind=True, name="bench.delay.plain40", rate_limit="40/s", acks_late=True)
def plain40(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


@limit("40/s", burst=1, scope="global")
@shared_task(bind=True, name="bench.delay.limited40", acks_late=True)
def limited40(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


def cost_per_task(n: int = 2000, batch: int = 100) -> tuple[float, float]:
    """``(round trips, microseconds)`` of park + claim + release + take per entry."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    prefix = f"b{uuid.uuid4().hex[:10]}"
    store = RedisDelayStore(client, prefix)
    body = b'[[1], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'
    entries = [
        Entry("bench.task", f"id{i}", "limit", body, "application/json", "utf-8",
              {"id": f"id{i}", "task": "bench.task", "retries": 0, "eta": None},
              {"correlation_id": f"id{i}", "priority": 0, "delivery_mode": 2}, "q", "q", "q")
        for i in range(n)
    ]  # fmt: skip
    try:
        started = time.perf_counter()
        for i, entry in enumerate(entries):
            store.park(f"e{i}", entry, 0.0)
        claims = []
        trips = n
        while len(claims) < n:
            got = store.claim(0.0, 30.0, [f"k{len(claims) + j}" for j in range(batch)]).items
            trips += 1
            claims.extend(got)
        for claim in claims:
            store.release(claim.entry_id, claim.token, 600.0)
            entry_ = Entry.loads(claim.raw)
            assert store.take(claim.entry_id, entry_.task_id, claim.token).status is Take.TAKEN
        trips += 2 * n
        elapsed = time.perf_counter() - started
    finally:
        client.delete(*delay_keys(prefix).values())
    return trips / n, elapsed / n * 1e6


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _run(conf: dict[str, Any], plain: bool, send: Any, tasks: int, deadline: float
         ) -> tuple[Counter[Any], list[float], int]:  # fmt: skip
    broker = require_broker("redis")
    ns = f"b{uuid.uuid4().hex[:10]}"
    journal = Journal(ns)
    app = proj.make_app(broker, ns, conf, INCLUDE, plain)
    env = proj.worker_env(broker, ns, conf, INCLUDE, plain)
    with tempfile.TemporaryDirectory(prefix="bench-delay-") as tmp:
        worker = WorkerProcess("w1", env, Path(tmp) / "w1.log", concurrency=2)
        try:
            worker.start()
            send(app)
            peak = 0
            end = time.monotonic() + deadline
            while time.monotonic() < end and len(journal) < tasks:
                peak = max(peak, _rss_kb(worker.pid))
                time.sleep(0.5)
            with contextlib.suppress(AssertionError):  # let late duplicates show
                wait_for(lambda: False, timeout=12, interval=0.5)
            peak = max(peak, _rss_kb(worker.pid))
            entries = journal.entries()
            return Counter(e["tag"] for e in entries), sorted(e["t"] for e in entries), peak
        finally:
            worker.stop()
            journal.clear()
            app.control.purge()
            app.close()


def countdowns(plain: bool, n: int = 300) -> tuple[int, int]:
    """``(tasks that ran more than once, peak RSS kB)`` for *n* countdowns of 15..35 s."""
    conf: dict[str, Any] = {"broker_transport_options": SHORT_VISIBILITY}
    if not plain:
        conf.update(extras_eta_store=True, extras_eta_threshold=5.0)

    def send(app: Any) -> None:
        with app.producer_or_acquire() as producer:
            for i in range(n):
                app.send_task("bench.delay.countdown", args=(i,), countdown=15 + 20 * i / n,
                              producer=producer)  # fmt: skip

    runs, _times, peak = _run(conf, plain, send, n, 90)
    return sum(1 for c in runs.values() if c > 1), peak


def backlog(plain: bool, n: int = 3000) -> tuple[float, int, int]:
    """``(rate over the run or by the deadline, tasks run twice, tasks done)``."""
    conf: dict[str, Any] = {"broker_transport_options": {**SHORT_VISIBILITY,
                                                         "visibility_timeout": 20}}  # fmt: skip
    name = "bench.delay.plain40" if plain else "bench.delay.limited40"

    def send(app: Any) -> None:
        with app.producer_or_acquire() as producer:
            for i in range(n):
                app.send_task(name, args=(i,), producer=producer)

    runs, times, _peak = _run(conf, plain, send, n, 150)
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return rate, sum(1 for c in runs.values() if c > 1), len(runs)


def measure() -> list[Row]:
    trips, micros = cost_per_task()
    dup_plain, rss_plain = countdowns(True)
    dup_extras, rss_extras = countdowns(False)
    rate_plain, twice_plain, done_plain = backlog(True)
    rate_extras, twice_extras, done_extras = backlog(False)
    return [
        Row("parked task: store round trips", "trips", None, trips, "<= 4", trips <= 4,
            note="park, claim (batches of 100), release, take"),
        Row("parked task: store work", "us", None, micros, "<= 1000", micros <= 1000,
            note="loopback Redis, client side"),
        Row("300 countdowns 15-35 s, vt 10 s: ran twice", "tasks", dup_plain, dup_extras,
            "0", dup_extras == 0, note="plain: Celery ETA; extras: extras_eta_store"),
        Row("300 countdowns: worker peak RSS", "MB", rss_plain / 1024, rss_extras / 1024,
            "<= plain", rss_extras <= rss_plain * 1.1),
        Row("3,000 at 40/s, vt 20 s: rate", "tasks/s", rate_plain, rate_extras, "40 +- 5%",
            abs(rate_extras - 40) <= 2, note=f"plain ran {done_plain} in 150 s"),
        Row("3,000 at 40/s, vt 20 s: ran twice", "tasks", twice_plain, twice_extras, "0",
            twice_extras == 0 and done_extras == 3000),
    ]  # fmt: skip
