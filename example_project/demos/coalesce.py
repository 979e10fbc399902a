"""Coalescing: many triggers of one account's reindex, one run at a time, none lost."""

from __future__ import annotations

import time

from celery import Celery, Task, shared_task

from celery_extras import coalesce

__all__ = ["reindex", "run"]


@coalesce(key=lambda args, kwargs: args[0])
@shared_task(bind=True, name="example.coalesce.reindex")
def reindex(self: Task, account: str, seconds: float = 1.0) -> dict[str, float | str]:
    started = time.time()
    time.sleep(seconds)
    return {"run": str(self.request.id), "started": started, "ended": time.time()}


def run(app: Celery) -> list[str]:
    first = reindex.delay("acct-7", 3.0)
    while first.state == "PENDING" and first.id not in _active(app):
        time.sleep(0.05)
    sent_at = time.time()
    triggers = [reindex.delay("acct-7", 0.2) for _ in range(20)]  # while it runs
    results = [r.get(timeout=30) for r in [first, *triggers]]
    runs = {r["run"]: r for r in results}
    if len(runs) != 2:
        raise AssertionError(f"21 triggers of acct-7 ran {len(runs)} times (expected 2)")
    second = next(r for run_id, r in runs.items() if run_id != str(first.id))
    if second["started"] < runs[str(first.id)]["ended"] or second["started"] < sent_at:
        raise AssertionError("the second run did not start after the first ended")
    return [
        "reindex('acct-7'): 1 running + 20 triggers sent while it ran -> 2 runs in all "
        "(the second started after the first ended), 21 results, one per caller",
    ]


def _active(app: Celery) -> set[str]:
    active = app.control.inspect(timeout=0.5).active() or {}
    return {task["id"] for tasks in active.values() for task in tasks}
