"""Concurrency slots: at most 2 exports running at once across both workers (4 processes)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from celery import Celery, Task, group, shared_task

from celery_extras import concurrency

__all__ = ["export", "most_at_once", "run"]

EXPORTS = 10
SECONDS = 0.3


@concurrency(2)  # cluster-wide: slots in the store's Redis, shared by every worker
@shared_task(bind=True, name="example.concurrency.export")
def export(self: Task, report: int, seconds: float = SECONDS) -> dict[str, Any]:
    started = time.time()
    time.sleep(seconds)
    return {"report": report, "worker": str(self.request.hostname), "started": started,
            "ended": time.time()}  # fmt: skip


def most_at_once(runs: Iterable[dict[str, Any]]) -> int:
    """The most runs between their ``started`` and ``ended`` at one time (one that ends
    when another starts does not overlap it)."""
    steps = sorted(step for r in runs for step in ((r["started"], 1), (r["ended"], -1)))
    running = most = 0
    for _, step in steps:
        running += step
        most = max(most, running)
    return most


def run(app: Celery) -> list[str]:
    began = time.monotonic()
    runs = group(export.s(i) for i in range(EXPORTS)).apply_async().get(timeout=30)
    took = time.monotonic() - began
    if sorted(r["report"] for r in runs) != list(range(EXPORTS)):
        raise AssertionError(f"export() returned {runs}")
    most = most_at_once(runs)
    if most > 2:
        raise AssertionError(f"concurrency(2): {most} exports ran at once")
    workers = Counter(r["worker"] for r in runs)
    return [
        f"{EXPORTS} export() tasks of {SECONDS} s under concurrency(2), sent to 2 workers of 2 "
        f"processes each: at most {most} ran at once (from their start and end times)",
        f"all {EXPORTS} ran in {took:.2f} s (at least {EXPORTS * SECONDS / 2:.1f} s at 2 at "
        f"a time), by {', '.join(f'{w}: {n}' for w, n in sorted(workers.items()))}",
    ]
