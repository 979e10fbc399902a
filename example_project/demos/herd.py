"""The delay store: a herd of ETA tasks parked outside the workers, each run once, on time.

The app sets ``extras_eta_store = True`` and ``extras_eta_threshold = 2.0`` (app.py), so a
task whose ETA is more than 2 s away is parked in the store's Redis instead of waiting,
unacked, in a worker's memory. 300 tasks share one ETA 5 s ahead; ``delayed(app)`` (what
``celery -A example_project.app extras delayed`` prints) shows them parked. Each run
appends its task id and start time to a journal (a Redis list), which shows that every
task ran once and none before its ETA. The movers publish a herd a little ahead of its ETA
(``extras_delay_lookahead``, ``extras_delay_herd_rate``); its messages keep their ETA, so
the workers start them at it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from functools import cache
from typing import Any

import redis
from celery import Celery, Task, shared_task

from celery_extras import clock, delayed, settings_of

__all__ = ["journal_client", "journal_key", "read_journal", "remind", "run"]

HERD = 300
AHEAD = 5.0  # seconds from sending to the ETA: further than the app's extras_eta_threshold
JOURNAL_TTL = 600  # seconds a journal is kept (a run cut short leaves nothing for long)


@cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def journal_client(app: Celery) -> redis.Redis:
    """A client of the broker's Redis (one per process), where the journals are kept."""
    url = str(app.conf.broker_url)
    if url.startswith(("redis+socket://", "socket://")):  # kombu's spelling of a unix socket
        url = "unix://" + url.split("://", 1)[1]
    return _client(url)


def journal_key(app: Celery, tag: str) -> str:
    return f"{app.conf.extras_key_prefix}:herd:{tag}"


def read_journal(app: Celery, key: str) -> list[tuple[str, float]]:
    """Every run recorded in *key*: ``(task id, start time)``, in the order they started."""
    return [tuple(json.loads(raw)) for raw in journal_client(app).lrange(key, 0, -1)]


@shared_task(bind=True, name="example.herd.remind", ignore_result=True)
def remind(self: Task, journal: str) -> None:
    started = clock.wall()  # time.time(), or the test's simulated time
    pipe = journal_client(self.app).pipeline()
    pipe.rpush(journal, json.dumps([self.request.id, started]))
    pipe.expire(journal, JOURNAL_TTL)
    pipe.execute()


def _parked(app: Celery) -> tuple[int, dict[str, Any]]:
    listing = delayed(app)
    return listing["tasks"].get(remind.name, {}).get("parked", 0), listing


def run(app: Celery) -> list[str]:
    settings = settings_of(app)
    threshold = float(settings["eta_threshold"])
    if not settings["eta_store"] or threshold >= AHEAD:
        raise AssertionError(f"the app must park ETAs {AHEAD} s ahead (threshold {threshold})")
    key = journal_key(app, uuid.uuid4().hex[:8])
    try:
        return _herd(app, key, threshold)
    finally:
        journal_client(app).delete(key)


def _herd(app: Celery, key: str, threshold: float) -> list[str]:
    eta = time.time() + AHEAD
    when = datetime.fromtimestamp(eta, UTC)
    for _ in range(HERD):
        remind.apply_async((key,), eta=when)
    # while they wait: parked in the store, or (the herd published ahead) already taken
    most, listing = _parked(app)
    while most < HERD and time.time() < eta - 1.0:
        time.sleep(0.1)
        parked, seen = _parked(app)
        if parked > most:
            most, listing = parked, seen
    if most == 0:
        raise AssertionError(f"none of {HERD} ETA tasks was parked: {listing}")
    entry = listing["tasks"][remind.name]

    deadline = eta + 30.0
    while len({task_id for task_id, _ in read_journal(app, key)}) < HERD:
        if time.time() > deadline:
            raise AssertionError(f"{len(read_journal(app, key))} of {HERD} ran in time")
        time.sleep(0.1)
    time.sleep(0.5)  # a second run of any of them would be recorded by now
    runs = read_journal(app, key)
    counts = Counter(task_id for task_id, _ in runs)
    twice = sum(1 for n in counts.values() if n > 1)
    first, last = min(t for _, t in runs) - eta, max(t for _, t in runs) - eta
    if len(counts) != HERD or twice:
        raise AssertionError(f"{len(counts)} of {HERD} ran, {twice} of them more than once")
    if first < 0:
        raise AssertionError(f"a task started {-first:.3f} s before its ETA")
    return [
        f"{HERD} remind() tasks sent with one ETA {AHEAD:.0f} s ahead (extras_eta_store, "
        f"threshold {threshold:g} s): parked in the store's Redis, not held in the workers",
        f"delayed(app) (celery -A example_project.app extras delayed): {listing['depth']} "
        f"entries waiting; {remind.name} {entry['parked']} parked, next due in "
        f"{entry['next_due_in']:.1f} s; due queues: {', '.join(listing['due_queues'])}",
        f"all {len(counts)} ran, {twice} twice (journal of task ids); none before the ETA: "
        f"first start {first:+.3f} s, last {last:+.3f} s after it",
    ]
