"""Throughput statistics: the workers count every task per name on time wheels.

20 successes and 3 failures are spread over the two workers; ``inspect stats``
(the same figures the ``worker-throughput`` events carry) must add up to exactly
that over the last 60 s.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, group, shared_task

__all__ = ["fails", "run", "succeeds"]


@shared_task(name="demo.stats.succeeds")
def succeeds(i: int) -> int:
    return i


@shared_task(name="demo.stats.fails")
def fails() -> None:
    raise ValueError("demo failure")


def _totals(app: Celery) -> tuple[dict[str, dict[str, int]], dict[str, Any]]:
    stats = app.control.inspect(timeout=1).stats() or {}
    totals: dict[str, dict[str, int]] = {}
    p95: dict[str, Any] = {}
    for reply in stats.values():
        figures = reply.get("extras", {})
        col = figures.get("windows", []).index(60) if 60 in figures.get("windows", []) else -1
        for name, task in figures.get("tasks", {}).items():
            if not name.startswith("demo.stats."):
                continue
            row = totals.setdefault(name, {"succeeded": 0, "failed": 0})
            row["succeeded"] += task["succeeded"][col]
            row["failed"] += task["failed"][col]
            if task["runtime"]["p95"] is not None:
                p95[name] = max(p95.get(name, 0.0), task["runtime"]["p95"])
    return totals, p95


def run(app: Celery) -> list[str]:
    group(succeeds.s(i) for i in range(20)).apply_async().get(timeout=30)
    failing = group(fails.s() for _ in range(3)).apply_async()
    failing.join(timeout=30, propagate=False)
    want = {"demo.stats.succeeds": {"succeeded": 20, "failed": 0},
            "demo.stats.fails": {"succeeded": 0, "failed": 3}}  # fmt: skip
    totals: dict[str, dict[str, int]] = {}
    p95: dict[str, Any] = {}
    for _ in range(20):  # the figures cover completed seconds: allow a few for the last one
        totals, p95 = _totals(app)
        if totals == want:
            break
    else:
        raise AssertionError(f"inspect stats counted {totals}, expected {want}")
    return [
        "20 successes and 3 failures counted exactly over the last 60 s by "
        f"{len(app.control.inspect(timeout=1).stats() or {})} workers (inspect stats 'extras')",
        f"p95 runtime of demo.stats.succeeds: {p95['demo.stats.succeeds'] * 1000:.2f} ms "
        "(watch live: celery -A example_project.app extras top)",
    ]
