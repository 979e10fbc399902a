"""The no-op task the throughput benchmarks drain: a module with no policy, so the app parks
nothing and its workers consume exactly their queue (no due queue, no mover), as an app
without ``limit()``, ``retry_policy()`` or ``extras_eta_store`` does."""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="bench.noop")
def noop(x: Any = None) -> Any:
    return x
