"""Herds: thousands of ETA tasks due at the same instant, Celery's timer beside the delay store.

One worker, prefork concurrency 2, Redis broker. Every task of a herd is sent with the same
ETA; plain Celery holds all of them in the worker (unacked, in its timer) from the moment
they arrive, ``extras_eta_store`` parks them in the store (threshold 5 s) and its mover
publishes the herd ahead of its time (``extras_delay_lookahead``, ``extras_delay_herd_rate``,
their defaults). The ETA is far enough ahead for that: the time to send the herd, plus the
time the herd rate gives it before it falls due (at most the lookahead), plus 30 s. The
figures: the time from the ETA to the start of the herd's last task, how many ran (and ran
twice), and the worker main process's peak RSS over the run. Then a herd of
:data:`ON_TWO_WORKERS` on two workers, whose two movers release it side by side: each task
runs once, none before its ETA (CI's test runs a herd of 5,000 so;
``python -m bench herd --two-workers N`` another size).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from celery import Task, shared_task

from celery_extras.delay.capability import DELAY
from tests.support.journal import Journal

from .runs import Cluster, Run, send_each
from .table import Row

__all__ = ["herd", "herd_on_two_workers", "measure"]

INCLUDE = ("bench.herd",)
#: sends per second the bench counts on when it picks the herd's ETA (a lower bound)
SEND_RATE = 1000.0
_DEFAULTS = {s.name: s.default for s in DELAY.settings}
#: the herd :func:`herd_on_two_workers` sends by default
ON_TWO_WORKERS = 20_000
ETA_STORE = {"extras_eta_store": True, "extras_eta_threshold": 5.0}
HERD_RATE: float = _DEFAULTS["delay_herd_rate"]
LOOKAHEAD: float = _DEFAULTS["delay_lookahead"]
_journals: dict[str, Journal] = {}


@shared_task(bind=True, name="bench.herd.member")
def member(self: Task, tag: Any = None) -> None:
    """Journals its start, on one connection per pool process (a herd is many short tasks)."""
    ns = self.app.main or "bench"
    journal = _journals.get(ns) or _journals.setdefault(ns, Journal(ns))
    journal.note(self, tag=tag)


def herd(plain: bool, n: int) -> tuple[float, int, int, int]:
    """``(seconds from the ETA to the last start, peak RSS kB, ran, ran twice)`` for *n*
    tasks due at once."""
    conf: dict[str, Any] = {} if plain else ETA_STORE
    with Run(conf, plain, INCLUDE, 0.5) as run:
        started = run.start()
        due = time.time() + _due_in(n)
        run.send(
            "bench.herd.member", ((i,) for i in range(n)), eta=datetime.fromtimestamp(due, UTC)
        )
        entries, runs = _ran(run.journal, n, due)
        last = max(e["t"] for e in entries)
        assert run.sampler is not None
        twice = sum(1 for c in runs.values() if c > 1)
        return last - due, run.sampler.peak_kb(started), len(runs), twice


def _ran(journal: Journal, n: int, due: float) -> tuple[list[dict[str, Any]], Counter[Any]]:
    """Once the herd of *n* due at *due* (sent just now) ran, or its deadline passed: the
    journal's entries, and the runs of each task (by tag)."""
    assert time.time() < due - 20, (
        f"sending {n:,} took until {due - time.time():.1f} s before the ETA"
    )
    deadline = due + 120 + n / 100
    while len(journal) < n and time.time() < deadline:
        time.sleep(0.5)
    time.sleep(2)  # a measurement period: late duplicates show up in it
    entries = journal.entries()
    return entries, Counter(e["tag"] for e in entries)


def _due_in(n: int) -> float:
    """Seconds ahead the ETA of a herd of *n* is set: sending, the herd rate's lead, 30 s."""
    return 30 + n / SEND_RATE + min(n / HERD_RATE, LOOKAHEAD)


def herd_on_two_workers(plain: bool, n: int) -> tuple[float, int, int, int]:
    """``(seconds from the ETA to the last start, ran, ran twice, ran before the ETA)`` for
    *n* tasks due at once on two workers (two movers, or two Celery timers)."""
    with Cluster(INCLUDE, {} if plain else ETA_STORE, plain) as run:
        for name in ("w1", "w2"):
            run.start(name)
        for worker in run.workers:
            worker.wait_ready(timeout=120)
        due = time.time() + _due_in(n)
        send_each(run.app, "bench.herd.member", ((i,) for i in range(n)),
                  eta=datetime.fromtimestamp(due, UTC))  # fmt: skip
        entries, runs = _ran(run.journal, n, due)
        early = sum(1 for e in entries if e["t"] < due - 0.05)
        twice = sum(1 for c in runs.values() if c > 1)
        return max(e["t"] for e in entries) - due, len(runs), twice, early


def measure(argv: Sequence[str] = ()) -> list[Row]:
    """Herds of 5,000 and 50,000 on one worker, and one of :data:`ON_TWO_WORKERS` (or
    ``--two-workers N``) on two; ``--two-workers`` alone runs only the last."""
    if argv:
        if len(argv) != 2 or argv[0] != "--two-workers" or not argv[1].isdigit():
            raise SystemExit("python -m bench herd [--two-workers N]")
        return _on_two_workers(int(argv[1]))
    rows: list[Row] = []
    for n in (5_000, 50_000):
        lag_p, peak_p, ran_p, twice_p = herd(True, n)
        lag_s, peak_s, ran_s, twice_s = herd(False, n)
        rows += [
            Row(f"herd of {n:,} due at once: ETA to last start", "s", lag_p, lag_s,
                "<= plain + 10%", lag_s <= lag_p * 1.1 and ran_s == n and twice_s == 0,
                note=f"1 worker, prefork 2, Redis; ran {ran_p:,} / {ran_s:,}, twice "
                     f"{twice_p} / {twice_s}"),
            Row(f"herd of {n:,} due at once: peak RSS", "MB", peak_p / 1024, peak_s / 1024,
                "-", True, note="worker main process, over the whole run"),
        ]  # fmt: skip
    return rows + _on_two_workers(ON_TWO_WORKERS)


def _on_two_workers(n: int) -> list[Row]:
    lag_p, ran_p, twice_p, early_p = herd_on_two_workers(True, n)
    lag_s, ran_s, twice_s, early_s = herd_on_two_workers(False, n)
    return [
        Row(f"herd of {n:,} due at once on 2 workers: ETA to last start", "s", lag_p, lag_s,
            "each once, none early", ran_s == n and twice_s == 0 and early_s == 0,
            note=f"2 workers, prefork 2, Redis; ran {ran_p:,} / {ran_s:,}, twice "
                 f"{twice_p} / {twice_s}, before the ETA {early_p} / {early_s}"),
    ]  # fmt: skip
