"""A flood in one queue and a trickle in another: shared by the fair-queue tests and bench/."""

from __future__ import annotations

import statistics
import time
from typing import Any

from celery import Celery

from .journal import Journal
from .workers import wait_for

__all__ = ["WORK", "p95", "publish", "runs", "trickle_waits"]

WORK = "tests.consumer.work"


def publish(app: Celery, queue: str, n: int, seconds: float = 0.02) -> list[str]:
    """Send *n* ``work`` tasks of *seconds* to *queue*, stamped with their publish time."""
    with app.producer_or_acquire() as producer:
        return [
            app.send_task(WORK, args=(queue, time.time(), seconds), queue=queue,
                          producer=producer, ignore_result=True).id
            for _ in range(n)
        ]  # fmt: skip


def runs(journal: Journal) -> list[dict[str, Any]]:
    """The journal's entries in start order."""
    return sorted(journal.entries(), key=lambda e: e["t"])


def trickle_waits(
    app: Celery, journal: Journal, flood: str, trickle: str, n_flood: int, n_trickle: int
) -> list[float]:
    """Flood queue *flood*, then send *n_trickle* tasks to *trickle* 50 ms apart; return the
    trickle tasks' publish-to-start waits."""
    publish(app, flood, n_flood)
    wait_for(lambda: len(journal) >= 50, timeout=60, what="the flood to be under way")
    for _ in range(n_trickle):
        publish(app, trickle, 1)
        time.sleep(0.05)
    wait_for(
        lambda: sum(e["queue"] == trickle for e in journal.entries()) >= n_trickle,
        timeout=120, interval=0.2, what="every trickle task",
    )  # fmt: skip
    return [e["waited"] for e in journal.entries() if e["queue"] == trickle]


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]
