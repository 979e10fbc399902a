"""Concurrency limits: hand-over latency, and ``concurrency(2)`` against the hand-written recipe.

* Hand-over: a task holds the only slot of ``concurrency(1)`` on worker A while a
  task of the same name waits on worker B (each worker consumes its own queue);
  from the holder's last instruction to the waiter's first, p95 over the rounds.
  That includes Celery's own path from the pool process back to the main process.
* Side by side, in one run on Redis: 3 workers at concurrency 3, 60 tasks of 0.2 s,
  at most 2 at once: celery-extras' ``concurrency(2)`` against the usual hand-written
  recipe (two Redis lock keys taken with ``SET NX PX``; no free key:
  ``self.retry(countdown=RECIPE_COUNTDOWN)``). Throughput, wasted retries, and the
  peak number running at once (from the runs' start and end stamps).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import redis
from celery import Task, shared_task

from celery_extras import concurrency
from tests.support.brokers import REDIS_URL
from tests.support.journal import Journal
from tests.support.workers import wait_for

from .runs import Cluster
from .table import Row

__all__ = ["measure"]

INCLUDE = ("bench.concurrency",)
RECIPE_COUNTDOWN = 0.5
ROUNDS = 40
TASKS = 60


def _journal(task: Task) -> Journal:
    return Journal(task.app.main or "bench")


@concurrency(1)
@shared_task(bind=True, name="bench.concurrency.one", ignore_result=True)
def one(self: Task, seconds: float, tag: Any = None) -> None:
    start = time.time()
    time.sleep(seconds)
    _journal(self).note(self, start=start, end=time.time(), tag=tag)


@concurrency(2)
@shared_task(bind=True, name="bench.concurrency.two", ignore_result=True)
def two(self: Task, tag: Any = None) -> None:
    start = time.time()
    time.sleep(0.2)
    _journal(self).note(self, start=start, end=time.time(), tag=tag)


_locks: dict[str, Any] = {}


@shared_task(bind=True, name="bench.concurrency.recipe", ignore_result=True, max_retries=None)
def recipe(self: Task, tag: Any = None) -> None:
    """The hand-written alternative: a Redis lock per slot, retry later when none is free."""
    client = _locks.setdefault("c", redis.Redis.from_url(REDIS_URL, decode_responses=True))
    ns = self.app.main or "bench"
    for slot in range(2):
        key = f"{ns}:recipe:{slot}"
        if client.set(key, self.request.id, nx=True, px=30_000):
            break
    else:
        raise self.retry(countdown=RECIPE_COUNTDOWN)
    try:
        start = time.time()
        time.sleep(0.2)
        _journal(self).note(self, start=start, end=time.time(), tag=tag)
    finally:
        if client.get(key) == self.request.id:
            client.delete(key)


def _peak(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _t, step in events:
        running += step
        peak = max(peak, running)
    return peak


def hand_over_ms(rounds: int = ROUNDS) -> list[float]:
    """Per round: ms from the holder's end on worker A to the waiter's start on worker B."""
    with Cluster(INCLUDE) as run:
        qa, qb = f"{run.ns}.a", f"{run.ns}.b"
        a = run.start("a", 2, (qa,))
        b = run.start("b", 2, (qb,))
        a.wait_ready()
        b.wait_ready()
        samples = []
        for i in range(rounds):
            run.app.send_task("bench.concurrency.one", args=(0.4, f"h{i}"), queue=qa)
            time.sleep(0.15)  # the holder has its slot
            run.app.send_task("bench.concurrency.one", args=(0.0, f"w{i}"), queue=qb)
            tags = (f"h{i}", f"w{i}")

            def both(tags: tuple[str, str] = tags) -> dict[str, Any] | None:
                found = {e["tag"]: e for e in run.journal.entries() if e["tag"] in tags}
                return found if len(found) == 2 else None

            entries = wait_for(both, timeout=30)
            holder, waiter = entries[f"h{i}"], entries[f"w{i}"]
            if waiter["start"] >= holder["end"]:  # it did wait for the holder
                samples.append((waiter["start"] - holder["end"]) * 1000)
        return samples


def side_by_side(task: str) -> tuple[float, int, int]:
    """(tasks/s, retries, peak running) for *TASKS* of *task* on 3 workers at concurrency 3."""
    with Cluster(INCLUDE) as run:
        for name in ("w1", "w2", "w3"):
            run.start(name, 3)
        for worker in run.workers:
            worker.wait_ready()
        for i in range(TASKS):
            run.app.send_task(task, args=(i,))
        wait_for(lambda: len(run.journal) >= TASKS, timeout=120, interval=0.2)
        entries = run.journal.entries()
        elapsed = max(e["end"] for e in entries) - min(e["start"] for e in entries)
        retries = sum(e["retries"] for e in entries)
        return TASKS / elapsed, retries, _peak([(e["start"], e["end"]) for e in entries])


def measure() -> list[Row]:
    samples = sorted(hand_over_ms())
    p95 = samples[max(0, round(0.95 * len(samples)) - 1)]
    rate_recipe, retries_recipe, peak_recipe = side_by_side("bench.concurrency.recipe")
    rate_extras, retries_extras, peak_extras = side_by_side("bench.concurrency.two")
    return [
        Row("concurrency(1): release on A -> waiter starts on B, p95", "ms", None, p95,
            "<= 50", p95 <= 50.0, runs=len(samples),
            note=f"p50 {statistics.median(samples):.1f} ms; loopback Redis"),
        Row("concurrency 2 x 0.2 s, 60 on 3 workers: throughput", "tasks/s", rate_recipe,
            rate_extras, ">= 9 (90% of 10)", rate_extras >= 9.0,
            note=f"plain: Redis locks + retry(countdown={RECIPE_COUNTDOWN})"),
        Row("  same run: wasted retries", "retries", retries_recipe, retries_extras, "0",
            retries_extras == 0),
        Row("  same run: peak running at once", "tasks", peak_recipe, peak_extras, "<= 2",
            peak_extras <= 2),
    ]  # fmt: skip
