"""``celery -A proj extras top``: a live table of the workers' ``worker-throughput`` events.

:func:`render` (pure) lays out one frame from the latest figures of each worker:
per task, the finished-task rate over each window, the counters over one chosen
window and the p95 runtime, cluster-wide first, then per worker. :func:`top`
feeds a :class:`~.listener.ClusterState` from the event stream and redraws the
frame in place every ``refresh`` seconds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TextIO

from celery import Celery

from .listener import ClusterState, Listener
from .schema import TaskFigures, Throughput

__all__ = ["DONE", "render", "top"]

#: Counters whose sum is the "finished" rate: every run that ended.
DONE = ("succeeded", "failed", "retried", "rejected")
_SHOWN = (
    ("recv", "received"),
    ("ok", "succeeded"),
    ("fail", "failed"),
    ("retry", "retried"),
    ("rej", "rejected"),
    ("rvk", "revoked"),
    ("rlim", "rate_limited"),
)
_CLEAR = "\x1b[H\x1b[2J"


def _window_label(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:.1f}" if n else "0"


def _merge(workers: Mapping[str, Throughput], windows: tuple[float, ...]) -> dict[str, TaskFigures]:
    """Sum the workers that use *windows*; runtime p95 is the largest worker's."""
    total: dict[str, TaskFigures] = {}
    for figures in workers.values():
        if figures.windows != windows:
            continue
        for name, task in figures.tasks.items():
            seen = total.get(name)
            if seen is None:
                total[name] = TaskFigures(dict(task.counts), dict(task.runtime))
                continue
            for counter, row in task.counts.items():
                summed = zip(seen.counts[counter], row, strict=True)
                seen.counts[counter] = tuple(a + b for a, b in summed)
            p95s = [p for p in (seen.runtime.get("p95"), task.runtime.get("p95")) if p is not None]
            seen.runtime["p95"] = max(p95s) if p95s else None
    return total


def render(workers: Mapping[str, Throughput], malformed: int = 0, now: float | None = None) -> str:
    """One frame of the table for the latest figures of *workers*."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    head = f"celery-extras top  {len(workers)} worker(s)  {stamp}  malformed events: {malformed}"
    if not workers:
        return head + "\n\nwaiting for worker-throughput events...\n"
    windows = next(iter(workers.values())).windows
    shown = 60 if 60 in windows else max(windows)
    col = windows.index(shown)
    name_width = max(
        [24] + [len(n) + 2 for f in workers.values() for n in f.tasks] + [len(h) for h in workers]
    )
    rates = [f"{_window_label(w)}" for w in windows]
    header = (
        "worker / task".ljust(name_width)
        + "".join(r.rjust(8) for r in rates)
        + " |"
        + "".join(label.rjust(6) for label, _ in _SHOWN)
        + " | p95 ms"
    )
    ruler = (
        "".ljust(name_width)
        + "finished/s".center(8 * len(windows))
        + " |"
        + f"last {_window_label(shown)}".center(6 * len(_SHOWN))
        + " |"
    )
    lines = [head, "", ruler, header]

    def rows(title: str, tasks: Mapping[str, TaskFigures], p95_label: str = "") -> None:
        lines.append(title)
        for name in sorted(tasks):
            task = tasks[name]
            done = [sum(task.counts[c][i] for c in DONE) for i in range(len(windows))]
            lines.append(
                f"  {name}".ljust(name_width)
                + "".join(_rate(n, w).rjust(8) for n, w in zip(done, windows, strict=True))
                + " |"
                + "".join(str(task.counts[c][col]).rjust(6) for _, c in _SHOWN)
                + " | "
                + _ms(task.runtime.get("p95"))
                + p95_label
            )

    rows("cluster", _merge(workers, windows), " (max)")
    others = [h for h, f in workers.items() if f.windows != windows]
    if others:
        lines.append(f"  (not in the cluster sums, other windows: {', '.join(others)})")
    for hostname, figures in workers.items():
        rows(hostname, figures.tasks)
    return "\n".join(lines) + "\n"


def top(
    app: Celery,
    refresh: float = 1.0,
    iterations: int | None = None,
    out: TextIO = sys.stdout,
    clear: bool = True,
    max_age: float = 30.0,
) -> int:
    """Draw the table every *refresh* s (*iterations* times, or until interrupted)."""
    state = ClusterState()
    listener = Listener(app, state)
    listener.start()
    drawn = 0
    try:
        while iterations is None or drawn < iterations:
            frame = render(state.workers(max_age), state.malformed)
            out.write((_CLEAR if clear else "") + frame)
            out.flush()
            drawn += 1
            if iterations is None or drawn < iterations:
                time.sleep(refresh)
    except KeyboardInterrupt:
        pass
    finally:
        listener.stop()
    return drawn
