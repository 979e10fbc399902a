"""Herds: thousands of ETA tasks due at the same instant, Celery's timer beside the delay store.

One worker, prefork concurrency 2, Redis broker. Every task of a herd is sent with the same
ETA, far enough ahead for the worker to have received (plain Celery) or parked
(``extras_eta_store``) all of them before it; the figure is the time from that ETA to the
start of the herd's last task, and the worker main process's peak RSS meanwhile.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from celery import Task, shared_task

from tests.support.journal import Journal

from .runs import Run
from .table import Row

__all__ = ["herd", "measure"]

INCLUDE = ("bench.herd",)
#: sends per second the bench counts on when it picks the herd's ETA (a lower bound)
SEND_RATE = 1500.0


_journals: dict[str, Journal] = {}


@shared_task(bind=True, name="bench.herd.member")
def member(self: Task, tag: Any = None) -> None:
    """Journals its start, on one connection per pool process (a herd is many short tasks)."""
    ns = self.app.main or "bench"
    journal = _journals.get(ns) or _journals.setdefault(ns, Journal(ns))
    journal.note(self, tag=tag)


def herd(plain: bool, n: int, workers: int = 1) -> tuple[float, int, int, int]:
    """``(seconds from the ETA to the last start, peak RSS kB, ran, ran twice)`` for *n*
    tasks due at once."""
    conf: dict[str, Any] = {} if plain else {"extras_eta_store": True, "extras_eta_threshold": 5.0}
    with Run(conf, plain, INCLUDE, 0.5) as run:
        run.start()
        due = time.time() + 10 + n / SEND_RATE
        eta = datetime.fromtimestamp(due, UTC)
        run.send("bench.herd.member", ((i,) for i in range(n)), eta=eta)
        sent = time.time()
        assert sent < due - 2, f"sending {n:,} took until {due - sent:.1f} s before the ETA"
        deadline = due + 120 + n / 100
        while len(run.journal) < n and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(2)  # a measurement period: late duplicates show up in it
        entries = run.journal.entries()
        runs = Counter(e["tag"] for e in entries)
        last = max(e["t"] for e in entries)
        assert run.sampler is not None
        return (
            last - due,
            run.sampler.peak_kb(due - 5),
            len(runs),
            sum(1 for c in runs.values() if c > 1),
        )


def measure() -> list[Row]:
    rows: list[Row] = []
    for n in (5_000, 50_000):
        lag_p, peak_p, ran_p, twice_p = herd(True, n)
        lag_s, peak_s, ran_s, twice_s = herd(False, n)
        rows += [
            Row(f"herd of {n:,}: due to last start", "s", lag_p, lag_s, "<= plain + 10%",
                lag_s <= lag_p * 1.1 and ran_s == n and twice_s == 0,
                note=f"ran {ran_p:,} / {ran_s:,}, twice {twice_p} / {twice_s}"),
            Row(f"herd of {n:,}: peak RSS", "MB", peak_p / 1024, peak_s / 1024, "-", True),
        ]  # fmt: skip
    return rows
