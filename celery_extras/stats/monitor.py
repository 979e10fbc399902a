"""``celery -A proj extras top``: a live table of the workers' ``worker-throughput`` events.

:func:`render` (pure) lays out one frame from the latest figures of each worker,
for a terminal of a given size: per task, the finished-task rate over each window,
the counters over one chosen window and the p95 runtime, cluster-wide first, then
per worker with its waiting and parked tasks and its store's state, and each queue's
depth, oldest message and prefetched messages. It never
writes a line wider than the terminal (task names are cut, then the least useful
columns dropped, down to 80 columns) nor more lines than it has (the header stays;
the rows that do not fit are counted). Names from events are escaped
(:func:`~.text.printable`): no control character reaches the terminal.

:func:`top` seeds its state from ``inspect stats`` (so the first frame already has
every worker's figures), then follows the event stream and redraws in place.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from celery import Celery

from . import gauges
from .emitter import worker_state
from .listener import ClusterState, Listener
from .schema import Malformed, TaskFigures, Throughput, merge_workers, parse
from .text import printable, truncate, window_label

__all__ = ["DONE", "MIN_WIDTH", "queue_rows", "render", "seed", "top"]

#: Counters whose sum is the "finished" rate: every run that ended.
DONE = ("succeeded", "failed", "retried", "rejected", "ignored")
#: The narrowest terminal the frame is laid out for.
MIN_WIDTH = 80
_NAME_MIN = 24
_RATE_WIDTH = 6
_COUNT_WIDTH = 6
_P95_WIDTH = 8
#: The size assumed when the output is not a terminal (a log): wide, every column.
_NOT_A_TERMINAL = (200, 50)
_CLEAR = "\x1b[H\x1b[2J"


@dataclass(frozen=True)
class _Column:
    label: str
    counter: str
    drop: int  # dropped first when the terminal is narrow: highest first; 0 never


#: Counts over the shown window, in display order.
_COUNTS = (
    _Column("recv", "received", 5),
    _Column("ok", "succeeded", 0),
    _Column("fail", "failed", 0),
    _Column("retry", "retried", 0),
    _Column("rej", "rejected", 4),
    _Column("rvk", "revoked", 6),
    _Column("rlim", "rate_limited", 0),
    _Column("park", "parked", 7),
    _Column("ign", "ignored", 8),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _rate(n: int, seconds: float) -> str:
    if not n:
        return "0"
    rate = n / seconds
    if rate < 0.095:
        return f"{rate:.2f}"
    return f"{rate:.1f}" if rate < 1000 else f"{rate:.0f}"


def _layout(
    windows: tuple[float, ...], width: int, names: list[str]
) -> tuple[int, list[int], list[_Column]]:
    """Name width, shown rate windows (indexes) and count columns for *width* columns."""
    rate_cols = list(range(len(windows)))
    counts = list(_COUNTS)

    def fixed() -> int:
        return len(rate_cols) * _RATE_WIDTH + 2 + len(counts) * _COUNT_WIDTH + _P95_WIDTH

    droppable = sorted((c for c in counts if c.drop), key=lambda c: -c.drop)
    while width - fixed() < _NAME_MIN and (droppable or len(rate_cols) > 1):
        if droppable:
            counts.remove(droppable.pop(0))
        else:
            rate_cols.pop()  # the longest window's rate goes before the short ones
    longest = max([len(n) + 3 for n in names] + [_NAME_MIN])
    return max(_NAME_MIN, min(width - fixed(), longest)), rate_cols, counts


def _gauges(state: Mapping[str, Any]) -> str:
    parts = []
    for gauge in ("waiting", "parked"):
        if gauge in state:
            parts.append(f"{gauge} {state[gauge]}")
    stores = state.get("store") or {}
    if stores:
        bad = sorted(k for k, v in stores.items() if v != "ok")
        parts.append("store ok" if not bad else "store " + ", ".join(
            f"{printable(k)} {printable(stores[k])}" for k in bad))  # fmt: skip
    buffered = state.get("buffered")
    if buffered:
        parts.append(f"buffered {sum(buffered.values())}")
    return "  ".join(parts)


@dataclass(frozen=True)
class _Table:
    """The columns one frame shows: the rate *windows* (those of *rate_cols*), the counts of
    the window at index *col*, and task names cut to *name_width*."""

    windows: tuple[float, ...]
    col: int
    name_width: int
    rate_cols: list[int]
    counts: list[_Column]

    def headings(self) -> list[str]:
        """The two heading lines: what each group of columns counts, then each column's label."""
        rates_width = _RATE_WIDTH * len(self.rate_cols)
        ruler = (
            "".ljust(self.name_width)
            + "finished/s".center(rates_width)[:rates_width]
            + " |"
            + f"last {window_label(self.windows[self.col])}".center(_COUNT_WIDTH * len(self.counts))
        )
        header = (
            "task".ljust(self.name_width)
            + "".join(window_label(self.windows[i]).rjust(_RATE_WIDTH) for i in self.rate_cols)
            + " |"
            + "".join(c.label.rjust(_COUNT_WIDTH) for c in self.counts)
            + "p95ms".rjust(_P95_WIDTH)
        )
        return [ruler, header]

    def rows(self, title: str, tasks: Mapping[str, TaskFigures], p95_mark: str = "") -> list[str]:
        """*title*, then one line per task of *tasks* (by name), its p95 marked *p95_mark*."""
        windows, rate_cols, col = self.windows, self.rate_cols, self.col
        lines = [title]
        for name in sorted(tasks):
            task = tasks[name]
            done = [sum(task.counts[c][i] for c in DONE) for i in range(len(windows))]
            lines.append(
                truncate("  " + printable(name), self.name_width - 1).ljust(self.name_width)
                + "".join(_rate(done[i], windows[i]).rjust(_RATE_WIDTH) for i in rate_cols)
                + " |"
                + "".join(str(task.counts[c.counter][col]).rjust(_COUNT_WIDTH) for c in self.counts)
                + (_ms(task.runtime.get("p95")) + p95_mark).rjust(_P95_WIDTH)
            )
        return lines


def _active(tasks: Mapping[str, TaskFigures]) -> dict[str, TaskFigures]:
    """The tasks of *tasks* that counted anything in any window."""
    return {n: t for n, t in tasks.items() if any(any(r) for r in t.counts.values())}


def _cluster_state(workers: Mapping[str, Throughput]) -> dict[str, Any]:
    """The workers' gauges merged as each gauge says (waiting summed, parked the largest)."""
    cluster_state: dict[str, Any] = {}
    for gauge in gauges.GAUGES:
        values = [f.state[gauge.key] for f in workers.values() if gauge.key in f.state]
        if gauge.merge is not None and values:
            cluster_state[gauge.key] = gauge.merge(values)
    return cluster_state


def _body(workers: Mapping[str, Throughput], table: _Table) -> list[str]:
    """The lines under the headings: the cluster's tasks and queues, then each worker's."""
    cluster_state = _cluster_state(workers)
    mark = "*" if len(workers) > 1 else ""
    cluster = _active(merge_workers(workers, table.windows))
    body = table.rows(f"cluster  {_gauges(cluster_state)}".rstrip(), cluster, mark)
    body.extend(queue_rows(cluster_state.get("queues") or {}, table.name_width))
    others = [printable(h) for h, f in workers.items() if f.windows != table.windows]
    if others:
        body.append(f"  (not in the cluster sums, other windows: {', '.join(others)})")
    for hostname, figures in workers.items():
        title = f"{printable(hostname)}  {_gauges(figures.state)}".rstrip()
        if figures.windows != table.windows:  # its counts do not fit the columns
            body.append(f"{title}  (windows {', '.join(map(window_label, figures.windows))})")
            continue
        body.extend(table.rows(title, _active(figures.tasks)))
    return body


def _fit(body: list[str], top: int, height: int | None) -> list[str]:
    """*body* cut to the lines a terminal of *height* has under *top* lines, the rest counted."""
    if height is not None and top + len(body) > max(height - 1, top + 2):
        room = max(1, height - 1 - top - 1)
        hidden = len(body) - room
        body = [*body[:room], f"... {hidden} more line(s): enlarge the terminal"]
    return body


def render(
    workers: Mapping[str, Throughput],
    malformed: int = 0,
    now: float | None = None,
    width: int = 100,
    height: int | None = None,
) -> str:
    """One frame for the latest figures of *workers*, at most *width* x *height* characters."""
    width = max(MIN_WIDTH, width)
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    head = f"celery-extras top  {len(workers)} worker(s)  {stamp}  malformed events: {malformed}"
    if not workers:
        return truncate(head, width) + "\n\nwaiting for worker-throughput events...\n"
    windows = next(iter(workers.values())).windows
    shown = 60 if 60 in windows else max(windows)
    names = [printable(n) for f in workers.values() for n in f.tasks]
    name_width, rate_cols, counts = _layout(windows, width, names)
    table = _Table(windows, windows.index(shown), name_width, rate_cols, counts)
    top_lines = [head, *table.headings()]
    body = _fit(_body(workers, table), len(top_lines), height)
    if len(workers) > 1:
        top_lines[0] = head + "  (* p95: the largest worker's)"
    return "\n".join(truncate(line, width) for line in (*top_lines, *body)) + "\n"


def queue_rows(queues: Mapping[str, Mapping[str, float]], name_width: int) -> list[str]:
    """The cluster's queue figures (:mod:`.queue_step`): per queue its depth on the broker,
    its oldest message's age (``-`` where the broker cannot tell it), what the delay store
    holds for it (``-`` where no store was read) and what workers hold."""
    if not queues:
        return []
    rows = ["queues".ljust(name_width) + "depth".rjust(9) + "oldest".rjust(10)
            + "parked".rjust(9) + "prefetched".rjust(12)]  # fmt: skip
    for name in sorted(queues):
        entry = queues[name]
        oldest, parked = entry.get("oldest"), entry.get("parked")
        rows.append(
            truncate("  " + printable(name), name_width - 1).ljust(name_width)
            + str(int(entry.get("depth", 0))).rjust(9)
            + ("-" if oldest is None else f"{oldest:.1f}s").rjust(10)
            + ("-" if parked is None else str(int(parked))).rjust(9)
            + str(int(entry.get("buffered", 0))).rjust(12)
        )
    return rows


def seed(app: Celery, state: ClusterState, timeout: float = 1.0) -> int:
    """Put each worker's figures from ``inspect stats`` into *state*; return how many."""
    try:
        replies = app.control.inspect(timeout=timeout).stats() or {}
    except Exception as exc:  # no broker yet: the events will come, or the frame says so
        state.drop("<inspect stats>", repr(exc))
        return 0
    seeded = 0
    for hostname, reply in replies.items():
        extras = reply.get("extras") if isinstance(reply, dict) else None
        if not isinstance(extras, dict):
            continue
        event = {
            **extras,
            "hostname": hostname,
            "timestamp": time.time(),
            "extras_state": worker_state(reply),
        }
        try:
            state.seed(parse(event))
        except Malformed as exc:
            state.drop(str(hostname), str(exc))
            continue
        seeded += 1
    return seeded


def top(
    app: Celery,
    refresh: float = 1.0,
    iterations: int | None = None,
    out: TextIO = sys.stdout,
    clear: bool = True,
    max_age: float = 30.0,
    inspect_timeout: float = 1.0,
) -> int:
    """Draw the table every *refresh* s (*iterations* times, or until interrupted)."""
    state = ClusterState()
    listener = Listener(app, state)
    listener.start()
    drawn = 0
    try:
        seed(app, state, inspect_timeout)
        while iterations is None or drawn < iterations:
            size = shutil.get_terminal_size(_NOT_A_TERMINAL)
            frame = render(
                state.workers(max_age),
                state.malformed,
                width=size.columns,
                height=size.lines if clear else None,
            )
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
