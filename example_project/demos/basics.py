"""Tasks round-trip through two workers with celery-extras installed."""

from __future__ import annotations

from celery import Celery, group

from ..tasks import add

__all__ = ["run"]


def run(app: Celery) -> list[str]:
    results = group(add.s(i, i) for i in range(20)).apply_async().get(timeout=30)
    if results != [2 * i for i in range(20)]:
        raise AssertionError(f"add() returned {results}")
    replies = app.control.ping(timeout=2)
    workers = sorted(name for reply in replies for name in reply)
    stats = app.control.inspect(timeout=2).stats() or {}
    versions = {w: s.get("extras_install", {}).get("version") for w, s in stats.items()}
    if not all(versions.values()):
        raise AssertionError(f"celery-extras is not reported by every worker: {versions}")
    return [
        f"20 add() tasks round-tripped; workers answering: {', '.join(workers)}",
        f"celery-extras {next(iter(versions.values()))} reported by {len(versions)} workers",
    ]
