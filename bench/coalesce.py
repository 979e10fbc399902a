"""Coalescing: ``coalesce()`` against the two recipes Celery users install, on one workload.

* **once** (celery-once's way): at publish, ``SET lock NX EX 3600``; taken: publish,
  else drop the message (celery-once raises ``AlreadyQueued``); the task deletes the
  lock when it returns.
* **singleton** (celery-singleton's way): at publish, ``SET lock <task id> NX`` (no
  expiry); taken: publish, else return the existing id's ``AsyncResult``; the task
  deletes the lock on success or failure.
* **coalesce**: ``coalesce(key=...)``; the producer publishes every message.

One workload for all three, in one run on Redis: 2 workers (prefork, concurrency 2),
20 keys, 600 messages sent at random times over about 6 s, each run 0.1 s. Figures: runs
executed, lost updates (messages with no run of their key starting after they were
sent), the most runs of one key at once (from the runs' start and end stamps), keys
stuck after a SIGKILL (5 keys running on a worker that is killed; one more message per
key afterwards: keys with no run 10 s later), and the cost per message: store round
trips (``INFO commandstats``) and the decision's latency on loopback Redis (p50).
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from typing import Any

import redis
from celery import Celery, Task, shared_task

from celery_extras import coalesce
from celery_extras.admission.sent import SENT_HEADER
from celery_extras.coalesce.redis_holds import RedisHolds
from tests.support.brokers import REDIS_URL
from tests.support.journal import Journal
from tests.support.workers import wait_for

from .runs import Cluster
from .table import Row

__all__ = ["measure"]

INCLUDE = ("bench.coalesce",)
KEYS, MESSAGES, RUN_SECONDS = 20, 600, 0.1
VARIANTS = ("once", "singleton", "coalesce")
_clients: dict[str, Any] = {}


def _client() -> Any:
    return _clients.setdefault("c", redis.Redis.from_url(REDIS_URL, decode_responses=True))


def _run(task: Task, key: str, seconds: float) -> None:
    start = time.time()
    time.sleep(seconds)
    Journal(task.app.main or "bench").note(task, key=key, start=start, end=time.time())


@coalesce(key=lambda args, kwargs: args[0], lease=3.0)
@shared_task(bind=True, name="bench.coalesce.coalesced", ignore_result=True)
def coalesced(self: Task, key: str, seconds: float = RUN_SECONDS) -> None:
    _run(self, key, seconds)


@shared_task(bind=True, name="bench.coalesce.once", ignore_result=True)
def once(self: Task, key: str, seconds: float = RUN_SECONDS) -> None:
    try:
        _run(self, key, seconds)
    finally:  # celery-once: after_return deletes the lock
        _client().delete(f"{self.app.main}:once:{key}")


@shared_task(bind=True, name="bench.coalesce.singleton", ignore_result=True)
def singleton(self: Task, key: str, seconds: float = RUN_SECONDS) -> None:
    try:
        _run(self, key, seconds)
    finally:  # celery-singleton: on_success / on_failure delete the lock
        _client().delete(f"{self.app.main}:singleton:{key}")


def publish(app: Celery, variant: str, key: str, seconds: float = RUN_SECONDS) -> bool:
    """Send one message of *variant* for *key* the way its recipe does; ``False`` if the
    recipe dropped it (once) or returned an existing id (singleton)."""
    ns = app.main
    if variant == "once":
        if not _client().set(f"{ns}:once:{key}", 1, nx=True, ex=3600):
            return False
        app.send_task("bench.coalesce.once", args=(key, seconds))
        return True
    if variant == "singleton":
        task_id = uuid.uuid4().hex
        if not _client().set(f"{ns}:singleton:{key}", task_id, nx=True):
            _client().get(f"{ns}:singleton:{key}")  # the existing id, handed to the caller
            return False
        app.send_task("bench.coalesce.singleton", args=(key, seconds), task_id=task_id)
        return True
    app.send_task("bench.coalesce.coalesced", args=(key, seconds),
                  headers={SENT_HEADER: time.time()})  # fmt: skip
    return True


def _evalsha_calls() -> int:
    stats = _client().info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def _peak_per_key(runs: list[dict[str, Any]]) -> int:
    peak = 0
    by_key: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        by_key.setdefault(run["key"], []).append((run["start"], run["end"]))
    for spans in by_key.values():
        events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
        running = 0
        for _t, step in events:
            running += step
            peak = max(peak, running)
    return peak


def workload(variant: str) -> dict[str, float]:
    """The one workload under *variant*: runs, lost updates, peak of one key, round trips."""
    rng = random.Random(24)
    with Cluster(INCLUDE) as run:
        for name in ("w1", "w2"):
            run.start(name)
        for worker in run.workers:
            worker.wait_ready()
        before = _evalsha_calls()
        sent: list[tuple[str, float]] = []
        published = 0
        for _ in range(MESSAGES):
            key = f"k{rng.randrange(KEYS)}"
            sent.append((key, time.time()))
            published += publish(run.app, variant, key)
            time.sleep(rng.expovariate(MESSAGES / 6.0))

        def settled() -> bool:
            n = len(run.journal)
            time.sleep(1.0)
            return len(run.journal) == n and _queue_empty(run)

        wait_for(settled, timeout=120, interval=0.5, what=f"{variant}: the runs to settle")
        runs = [e for e in run.journal.entries() if "key" in e]
        scripts = _evalsha_calls() - before
        by_key: dict[str, list[float]] = {}
        for entry in runs:
            by_key.setdefault(entry["key"], []).append(entry["start"])
        lost = sum(1 for key, t in sent if not any(s > t for s in by_key.get(key, [])))
        recipe_trips = published + len(runs)  # SET NX per publish, DEL per run
        trips = scripts if variant == "coalesce" else recipe_trips
        return {"runs": len(runs), "lost": lost, "peak": _peak_per_key(runs),
                "trips": trips / MESSAGES}  # fmt: skip


def _queue_empty(run: Cluster) -> bool:
    """Nothing left in the run's queue (a Redis list on this broker)."""
    return int(_client().llen(run.ns)) == 0


def stuck_after_sigkill(variant: str, keys: int = 5, lease: float = 3.0) -> int:
    """Keys of *variant* that run no more after the worker running them was SIGKILLed."""
    with Cluster(INCLUDE) as run:
        victim = run.start("victim", concurrency=keys)
        victim.wait_ready()
        for i in range(keys):
            publish(run.app, variant, f"s{i}", 30.0)
        wait_for(lambda: len(_running(run)) == keys, timeout=30, what="the runs to start")
        victim.kill()
        survivor = run.start("survivor")
        survivor.wait_ready()
        time.sleep(lease + 1.0)  # the holds of the killed runs may lapse, as coalesce()'s do
        for i in range(keys):
            publish(run.app, variant, f"s{i}", 0.0)
        time.sleep(10.0)  # a measurement period: what has run by then
        ran = {e["key"] for e in run.journal.entries() if "key" in e}
        return keys - len(ran)


def _running(run: Cluster) -> list[Any]:
    active = run.app.control.inspect(timeout=1.0).active() or {}
    return [t for tasks in active.values() for t in tasks]


def decision_us(variant: str, calls: int = 3000) -> float:
    """p50 µs of the decision one message costs: the recipe's ``SET NX`` or the ``ask``."""
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"b{uuid.uuid4().hex[:10]}"
    holds = RedisHolds(client, prefix)
    samples = []
    try:
        for i in range(calls):
            key = f"k{i % 50}"
            start = time.perf_counter()
            if variant == "coalesce":
                holds.ask(("bench", key), f"m{i}", time.time(), "h", 30.0, "first", 0)
            else:
                client.set(f"{prefix}:{key}", i, nx=True, ex=3600)
            samples.append((time.perf_counter() - start) * 1e6)
    finally:
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)
        client.close()
    return statistics.median(samples)


def measure() -> list[Row]:
    figures = {v: workload(v) for v in VARIANTS}
    stuck = {v: stuck_after_sigkill(v) for v in VARIANTS}
    cost = {v: decision_us(v) for v in VARIANTS}
    lines = [
        ("runs executed", [figures[v]["runs"] for v in VARIANTS]),
        ("lost updates", [figures[v]["lost"] for v in VARIANTS]),
        ("most runs of one key at once", [figures[v]["peak"] for v in VARIANTS]),
        ("store round trips per message", [figures[v]["trips"] for v in VARIANTS]),
        ("keys stuck after a SIGKILL (of 5)", [stuck[v] for v in VARIANTS]),
        ("decision per message, p50 (us)", [cost[v] for v in VARIANTS]),
    ]
    print(f"\n{'600 messages, 20 keys, 2 workers':<40}" + "".join(f"{v:>11}" for v in VARIANTS))
    for label, values in lines:
        print(f"{label:<40}" + "".join(f"{value:>11.2f}" for value in values))
    once_, single, ours = figures["once"], figures["singleton"], figures["coalesce"]
    note = "plain: once (SET NX EX 3600, drop); singleton: {s}"
    return [
        Row("coalesce, 600 msgs/20 keys: runs executed", "runs", once_["runs"], ours["runs"],
            "<= messages", ours["runs"] <= MESSAGES, note=note.format(s=f"{single['runs']:.0f}")),
        Row("  same run: lost updates", "messages", once_["lost"], ours["lost"], "0",
            ours["lost"] == 0, note=note.format(s=f"{single['lost']:.0f}")),
        Row("  same run: most runs of one key at once", "runs", once_["peak"], ours["peak"],
            "1", ours["peak"] == 1, note=note.format(s=f"{single['peak']:.0f}")),
        Row("  same run: store round trips per message", "calls", once_["trips"], ours["trips"],
            "-", True, note=note.format(s=f"{single['trips']:.2f}")),
        Row("  keys stuck after a SIGKILL (of 5)", "keys", stuck["once"], stuck["coalesce"], "0",
            stuck["coalesce"] == 0, note=note.format(s=str(stuck["singleton"]))),
        Row("  decision per message, p50 (loopback Redis)", "us", cost["once"], cost["coalesce"],
            "-", True, note=note.format(s=f"{cost['singleton']:.0f} us")),
    ]  # fmt: skip
