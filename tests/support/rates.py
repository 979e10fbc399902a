"""Rates measured from the journal's start times, which the pool processes write as each
task starts."""

from __future__ import annotations

from collections.abc import Sequence

from tests.support.journal import Journal

__all__ = ["JITTER", "busiest_second", "busiest_window", "starts"]

#: Starts are journalled by the pool processes, so a second's count also carries the pool's
#: dispatch jitter: on the shared 2-core test machine (load about 4) two tasks booked 25 ms
#: apart often start within 2 ms of each other. There, 1,200 tasks at 40/s held in the worker
#: (no delay store: ``extras_limit_max_hold`` 100) saw 51 starts in their busiest second,
#: parked ones 45 to 47, and 400 tasks at 20/s over three workers 24 (CI, 2026-11-27, beside
#: another scenario). The bound is ``rate + burst``; tests allow a quarter more for that
#: jitter and print the busiest window (:func:`busiest_window`).
JITTER = 1.25


def starts(journal: Journal, task: str) -> list[float]:
    """The start times of *task*'s runs in *journal*, in order."""
    return sorted(e["t"] for e in journal.entries() if e["task"] == task)


def _in_second(times: Sequence[float], first: float) -> int:
    return sum(1 for s in times if first <= s < first + 1.0)


def busiest_second(times: Sequence[float]) -> int:
    """The most starts in one second that begins at a start."""
    return max((_in_second(times, t) for t in times), default=0)


def busiest_window(times: Sequence[float]) -> str:
    """The busiest second's starts, relative to its first and to the run's first start."""
    first = max(times, key=lambda t: _in_second(times, t))
    inside = [f"{s - first:.3f}" for s in times if first <= s < first + 1.0]
    return f"at {first - times[0]:.1f} s: {' '.join(inside)}"
