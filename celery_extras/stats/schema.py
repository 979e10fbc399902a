"""The ``worker-throughput`` event, checked: what monitors may trust, or why not.

:func:`parse` turns an event (a dict decoded from JSON, from any sender) into a
:class:`Throughput` or raises :class:`Malformed` saying what is wrong. It bounds
what it accepts (windows, task names, name length), so a huge or hostile payload
costs a check, not memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ..checks import is_int, is_number
from . import gauges
from .histogram import BUCKETS, SCALE, upper_bound
from .recorder import BASE_COUNTERS, COUNTERS, PERCENTILES
from .wire import MAX_NAME, MAX_TASKS, MAX_WINDOWS
from .wire import count as _count

__all__ = [
    "MAX_NAME",
    "MAX_TASKS",
    "MAX_WINDOWS",
    "RUNTIME_FIELDS",
    "Malformed",
    "RuntimeTotal",
    "TaskFigures",
    "Throughput",
    "merge_workers",
    "parse",
]

RUNTIME_FIELDS = ("count", "sum", "max", *(f"p{p}" for p in PERCENTILES))


class Malformed(ValueError):
    """A ``worker-throughput`` event that does not follow the contract."""


@dataclass(frozen=True)
class RuntimeTotal:
    """Every successful run since the worker started: count, sum, bucket counts.

    ``buckets`` maps a bucket's upper bound in seconds (``inf`` for the last) to
    the runs in it, from the worker's log-scale histogram.
    """

    count: int
    total: float
    buckets: dict[float, int]


@dataclass(frozen=True)
class TaskFigures:
    """One task's counters (one count per window) and runtime summary.

    ``totals`` (each counter since the worker started) and ``runtime_total`` are
    ``None`` from a worker older than these fields.
    """

    counts: dict[str, tuple[int, ...]]
    runtime: dict[str, float | None]
    totals: dict[str, int] | None = None
    runtime_total: RuntimeTotal | None = None


@dataclass(frozen=True)
class Throughput:
    """One worker's figures as of its event's timestamp.

    ``state`` holds the worker's gauges from ``extras_state``, each checked as its
    entry of :data:`.gauges.GAUGES` says and present only when the worker sent it:
    ``store`` (``{capability: "ok"|"down"|...}``), ``eviction``, ``waiting`` and
    ``parked`` (ints), ``buffered`` (``{queue: int}``), ``concurrency``.
    """

    hostname: str
    timestamp: float
    windows: tuple[float, ...]
    tasks: dict[str, TaskFigures]
    state: dict[str, Any] = field(default_factory=dict)


def _number(value: Any) -> TypeGuard[float]:
    return is_number(value)


def parse(event: Mapping[str, Any]) -> Throughput:
    """The figures of *event*, or :class:`Malformed` naming the first thing wrong."""
    if not isinstance(event, Mapping):
        raise Malformed(f"event is a {type(event).__name__}, not a mapping")
    hostname = event.get("hostname")
    if not isinstance(hostname, str) or not hostname or len(hostname) > MAX_NAME:
        raise Malformed("hostname missing or not a short string")
    timestamp = event.get("timestamp")
    if not _number(timestamp):
        raise Malformed("timestamp missing or not a number")
    windows = event.get("windows")
    if not isinstance(windows, list) or not 0 < len(windows) <= MAX_WINDOWS:
        raise Malformed(f"windows must be a list of 1 to {MAX_WINDOWS} numbers")
    if not all(_number(w) and w > 0 for w in windows):
        raise Malformed("windows must be positive numbers")
    tasks = event.get("tasks")
    if not isinstance(tasks, dict):
        raise Malformed("tasks missing or not a mapping")
    if len(tasks) > MAX_TASKS:
        raise Malformed(f"tasks lists {len(tasks)} names, more than {MAX_TASKS}")
    scale = _scale(event.get("runtime_scale"))
    figures = {}
    for name, task in tasks.items():
        if not isinstance(name, str) or len(name) > MAX_NAME:
            raise Malformed("a task name is not a string or is too long")
        figures[name] = _task(name, task, len(windows), scale)
    state = _state(event.get("extras_state"))
    return Throughput(hostname, float(timestamp), tuple(windows), figures, state)


def _scale(scale: Any) -> dict[str, int]:
    if scale is None:
        return dict(SCALE)
    if not isinstance(scale, dict) or set(scale) != set(SCALE):
        raise Malformed(f"runtime_scale must have exactly {sorted(SCALE)}")
    if not all(is_int(v) for v in scale.values()):
        raise Malformed("runtime_scale values must be integers")
    per_octave, low, high = scale["per_octave"], scale["low_exp"], scale["high_exp"]
    if not (1 <= per_octave <= 64 and -64 <= low < high <= 64):
        raise Malformed("runtime_scale out of range")
    return {"per_octave": per_octave, "low_exp": low, "high_exp": high}


def _task(name: str, task: Any, n_windows: int, scale: dict[str, int]) -> TaskFigures:
    if not isinstance(task, dict):
        raise Malformed(f"tasks[{name!r}] is not a mapping")
    counts = {}
    for counter in COUNTERS:
        row = task.get(counter)
        if row is None and counter not in BASE_COUNTERS:  # a worker older than the counter
            row = [0] * n_windows
        if not isinstance(row, list) or len(row) != n_windows or not all(map(_count, row)):
            raise Malformed(
                f"tasks[{name!r}][{counter!r}] must be {n_windows} non-negative integers"
            )
        counts[counter] = tuple(row)
    runtime = task.get("runtime")
    if not isinstance(runtime, dict):
        raise Malformed(f"tasks[{name!r}]['runtime'] missing or not a mapping")
    checked: dict[str, float | None] = {}
    for field_ in RUNTIME_FIELDS:
        value = runtime.get(field_)
        if value is None and field_.startswith("p"):
            checked[field_] = None
        elif _number(value) and value >= 0:
            checked[field_] = float(value)
        else:
            raise Malformed(f"tasks[{name!r}]['runtime'][{field_!r}] is not a number >= 0")
    totals = task.get("total")
    if totals is not None:
        if not isinstance(totals, dict):
            raise Malformed(f"tasks[{name!r}]['total'] is not a mapping")
        totals = {c: totals.get(c, 0 if c not in BASE_COUNTERS else None) for c in COUNTERS}
        if not all(map(_count, totals.values())):
            raise Malformed(f"tasks[{name!r}]['total'] must map each counter to an integer >= 0")
    return TaskFigures(counts, checked, totals, _runtime_total(name, task, scale))


def _runtime_total(name: str, task: dict[str, Any], scale: dict[str, int]) -> RuntimeTotal | None:
    every = task.get("runtime_total")
    if every is None:
        return None
    where = f"tasks[{name!r}]['runtime_total']"
    if not isinstance(every, dict):
        raise Malformed(f"{where} is not a mapping")
    count, total, buckets = every.get("count"), every.get("sum"), every.get("buckets")
    if not _count(count) or not _number(total) or total < 0:
        raise Malformed(f"{where} needs a count >= 0 and a sum >= 0")
    n_buckets = (scale["high_exp"] - scale["low_exp"]) * scale["per_octave"] + 1
    if not isinstance(buckets, list) or len(buckets) > min(n_buckets, BUCKETS * 4):
        raise Malformed(f"{where}['buckets'] must be a list of at most {n_buckets} pairs")
    bounds: dict[float, int] = {}
    for pair in buckets:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not _count(pair[0])
            or pair[0] >= n_buckets
            or not _count(pair[1])
        ):
            raise Malformed(f"{where}['buckets'] holds a bad [index, count] pair")
        bound = upper_bound(pair[0], **scale)
        bounds[bound] = bounds.get(bound, 0) + pair[1]
    if sum(bounds.values()) != count:
        raise Malformed(f"{where}: the buckets do not add up to the count")
    return RuntimeTotal(count, float(total), bounds)


def _state(state: Any) -> dict[str, Any]:
    """The gauges of *state* (``extras_state``), each checked as :data:`.gauges.GAUGES` says."""
    if state is None:
        return {}
    if not isinstance(state, dict):
        raise Malformed("extras_state is not a mapping")
    checked: dict[str, Any] = {}
    for gauge in gauges.GAUGES:
        value = state.get(gauge.key)
        if value is None:
            continue
        good = gauge.check(value)
        if good is None:
            raise Malformed(f"extras_state[{gauge.key!r}] must {gauge.expected}")
        checked[gauge.key] = good
    return checked


def merge_workers(
    workers: Mapping[str, Throughput], windows: tuple[float, ...]
) -> dict[str, TaskFigures]:
    """Sum the workers that use *windows*; runtime p50 and p95 are the largest worker's."""
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
            for p in ("p50", "p95"):
                values = [v for v in (seen.runtime.get(p), task.runtime.get(p)) if v is not None]
                seen.runtime[p] = max(values) if values else None
    return total
