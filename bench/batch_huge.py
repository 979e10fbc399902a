"""``python -m bench batch_huge``: a batch of 10,000 calls, pinged every 0.2 s (issue 51).

One worker (prefork, concurrency 2, Redis broker and result backend) gets 10,000 calls
while the bench pings it every 0.2 s (``control.ping``, 0.5 s timeout) from the first
call sent to the last result stored. celery-extras runs them as one batch
(``batch(size=10000, wait=60)``): the calls wait unacked in the worker's main process
until the last arrives, run as one pool job, and end (result, event, ack each) in slices
between turns of the worker's loop. Plain Celery gets the same 10,000 calls of the
unbatched no-op, with unlimited prefetch (``worker_prefetch_multiplier=0``) behind two
tasks that hold both pool processes until all 10,000 wait in its main process too; then
it runs them. celery-batches would hold the 10,000 in its buffer as well, but acks them
before they run and ends none of them itself (no result unless stored by hand).

Figures, side by side: the slowest ping reply and the pings left unanswered (every ping
answered within its timeout is the target), and the growth of the main process's peak
resident memory (``VmHWM``) from the idle worker, per waiting call. Every caller's result
is checked.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import shared_task

from celery_extras import Call, batch
from tests.support import proj
from tests.support.brokers import BACKEND_URL, REDIS_URL, require_broker
from tests.support.workers import WorkerProcess, wait_for

from .batch import all_stored, clean_up
from .table import Row

__all__ = ["measure"]

INCLUDE = ("bench.batch", "bench.batch_huge")  # plain Celery's task: bench.batch.noop
CALLS = 10_000
PING_EVERY, PING_TIMEOUT = 0.2, 0.5


@batch(size=CALLS, wait=60.0)
@shared_task(name="bench.batch_huge.batched")
def batched(calls: list[Call]) -> list[Any]:
    return [call.args[0] for call in calls]


@shared_task(name="bench.batch_huge.hold")
def hold(flag: str) -> None:
    """Hold a pool process until *flag* is set in Redis (10 minutes at most)."""
    client = redis.Redis.from_url(REDIS_URL)
    deadline = time.monotonic() + 600
    while not client.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
    client.close()


def _results(results: redis.Redis, keys: list[str]) -> list[Any]:
    """The stored results of result *keys*, in order (``None`` for one not a success)."""
    got: list[Any] = []
    for i in range(0, len(keys), 1000):
        for raw in results.mget(keys[i : i + 1000]):
            meta = json.loads(raw) if raw else {}
            got.append(meta.get("result") if meta.get("status") == "SUCCESS" else None)
    return got


def peak_kb(pid: int) -> int:
    """Peak resident set size (``VmHWM``) of process *pid* so far, in kB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


@dataclass
class Pinger:
    """Pings *hostname* every :data:`PING_EVERY` s in a thread until stopped; each reply's
    wait in seconds, ``None`` for a ping left unanswered."""

    app: Any
    hostname: str
    waits: list[float | None] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.done.is_set():
            asked = time.monotonic()
            replies = self.app.control.ping(destination=[self.hostname], timeout=PING_TIMEOUT)
            self.waits.append(time.monotonic() - asked if replies else None)
            self.done.wait(max(0.0, PING_EVERY - (time.monotonic() - asked)))


@dataclass
class Run:
    """One side's figures."""

    slowest: float
    unanswered: int
    pings: int
    kb_per_call: float
    seconds: float


def _run(task: str, plain: bool, calls: int) -> Run:
    ns = f"b{uuid.uuid4().hex[:10]}"
    broker = require_broker("redis")
    conf = {"worker_prefetch_multiplier": 0} if plain else {}
    app = proj.make_app(broker, ns, conf, INCLUDE, plain=plain)
    client, results = redis.Redis.from_url(REDIS_URL), redis.Redis.from_url(BACKEND_URL)
    with tempfile.TemporaryDirectory(prefix="bench-batch-huge-") as tmp:
        worker = WorkerProcess("w1", proj.worker_env(broker, ns, conf, INCLUDE, plain),
                               Path(tmp) / "w1.log", concurrency=2)  # fmt: skip
        keys: list[str] = []
        try:
            worker.start()
            time.sleep(1.0)  # settled: its pool processes forked, its first heartbeat out
            idle = peak_kb(worker.pid)
            pinger = Pinger(proj.make_app(broker, ns, conf, INCLUDE, plain=plain), worker.hostname)
            thread = threading.Thread(target=pinger.run, daemon=True)
            started = time.monotonic()
            thread.start()
            flag = f"{ns}:go"
            held = [app.send_task("bench.batch_huge.hold", args=(flag,)) for _ in (1, 2)]
            sent = [app.send_task(task, args=(i,)) for i in range(calls)]
            keys = [f"celery-task-meta-{r.id}" for r in (*held, *sent)]
            if plain:  # every message in the worker, then the pool free to run them
                wait_for(lambda: client.llen(ns) == 0, timeout=600, interval=0.1,
                         what=f"{calls} messages prefetched")  # fmt: skip
            client.set(flag, 1, ex=600)

            wait_for(lambda: all_stored(results, keys), timeout=900, interval=0.1,
                     what=f"{calls} results of {task}")  # fmt: skip
            seconds = time.monotonic() - started
            pinger.done.set()
            thread.join()
            pinger.app.close()
            assert _results(results, keys[2:]) == list(range(calls)), "a wrong result"
            peak = peak_kb(worker.pid)
            answered = [w for w in pinger.waits if w is not None]
            return Run(max(answered, default=float("inf")), pinger.waits.count(None),
                       len(pinger.waits), (peak - idle) / calls, seconds)  # fmt: skip
        finally:
            worker.stop()
            app.close()
            clean_up(client, results, ns, keys)


def measure(calls: int = CALLS) -> list[Row]:
    """Plain Celery holding then running *calls* no-ops beside celery-extras running them
    as one batch: ping replies and peak memory per waiting call."""
    plain = _run("bench.batch.noop", True, calls)
    extras = _run("bench.batch_huge.batched", False, calls)
    where = f"{calls:,} calls, prefork c=2, redis, ping every {PING_EVERY} s"
    note = (
        f"plain: {plain.pings} pings over {plain.seconds:.1f} s ({calls:,} no-ops prefetched "
        f"behind 2 held tasks); extras: {extras.pings} pings over {extras.seconds:.1f} s "
        f"(one batch)"
    )
    return [
        Row(f"batch of {calls:,}: slowest ping reply ({where})", "s", round(plain.slowest, 3),
            round(extras.slowest, 3), f"<= {PING_TIMEOUT} s", extras.slowest <= PING_TIMEOUT,
            note=note),
        Row(f"batch of {calls:,}: pings unanswered ({where})", "pings", plain.unanswered,
            extras.unanswered, "0", extras.unanswered == 0),
        Row(f"batch of {calls:,}: worker main process peak memory per waiting call",
            "kB", round(plain.kb_per_call, 2), round(extras.kb_per_call, 2), "reported",
            True),
    ]  # fmt: skip
