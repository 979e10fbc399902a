"""The ``worker-throughput`` event, checked: what monitors may trust, or why not.

:func:`parse` turns an event (a dict decoded from JSON, from any sender) into a
:class:`Throughput` or raises :class:`Malformed` saying what is wrong. It bounds
what it accepts (windows, task names, name length), so a huge or hostile payload
costs a check, not memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from .recorder import COUNTERS, PERCENTILES

__all__ = [
    "MAX_NAME",
    "MAX_TASKS",
    "MAX_WINDOWS",
    "RUNTIME_FIELDS",
    "Malformed",
    "TaskFigures",
    "Throughput",
    "parse",
]

MAX_WINDOWS = 16
MAX_TASKS = 10_000
MAX_NAME = 500
RUNTIME_FIELDS = ("count", "sum", "max", *(f"p{p}" for p in PERCENTILES))


class Malformed(ValueError):
    """A ``worker-throughput`` event that does not follow the contract."""


@dataclass(frozen=True)
class TaskFigures:
    """One task's counters (one count per window) and runtime summary."""

    counts: dict[str, tuple[int, ...]]
    runtime: dict[str, float | None]


@dataclass(frozen=True)
class Throughput:
    """One worker's figures as of its event's timestamp."""

    hostname: str
    timestamp: float
    windows: tuple[float, ...]
    tasks: dict[str, TaskFigures]


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
    figures = {}
    for name, task in tasks.items():
        if not isinstance(name, str) or len(name) > MAX_NAME:
            raise Malformed("a task name is not a string or is too long")
        figures[name] = _task(name, task, len(windows))
    return Throughput(hostname, float(timestamp), tuple(windows), figures)


def _task(name: str, task: Any, n_windows: int) -> TaskFigures:
    if not isinstance(task, dict):
        raise Malformed(f"tasks[{name!r}] is not a mapping")
    counts = {}
    for counter in COUNTERS:
        row = task.get(counter)
        if not isinstance(row, list) or len(row) != n_windows or not all(map(_count, row)):
            raise Malformed(
                f"tasks[{name!r}][{counter!r}] must be {n_windows} non-negative integers"
            )
        counts[counter] = tuple(row)
    runtime = task.get("runtime")
    if not isinstance(runtime, dict):
        raise Malformed(f"tasks[{name!r}]['runtime'] missing or not a mapping")
    checked: dict[str, float | None] = {}
    for field in RUNTIME_FIELDS:
        value = runtime.get(field)
        if value is None and field.startswith("p"):
            checked[field] = None
        elif _number(value) and value >= 0:
            checked[field] = float(value)
        else:
            raise Malformed(f"tasks[{name!r}]['runtime'][{field!r}] is not a number >= 0")
    return TaskFigures(counts, checked)
