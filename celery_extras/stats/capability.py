"""The stats capability as ``install(app)`` wires it: settings, bootsteps, hooks."""

from __future__ import annotations

from typing import Any

from ..capability import Capability
from ..checks import is_int
from ..settings import Setting, boolean, number, reject
from .emitter import StatsEmitter
from .queue_stamp import connect_stamp
from .queue_step import QueueFiguresStep
from .steps import StatsRecording, TaskCounting
from .timewheel import minute_wheel

__all__ = ["STATS", "windows"]


def windows(key: str, value: Any) -> list[int]:
    """Window lengths in whole seconds: up to 60 s, or whole minutes up to 1 h."""
    expected = (
        "a non-empty list of distinct whole seconds, each <= 60 or a whole number of "
        "minutes <= 3600"
    )
    if not isinstance(value, list | tuple) or not value:
        raise reject(key, expected, value)
    for window in value:
        if not is_int(window):
            raise reject(key, expected, value)
    try:
        minute_wheel(1).check_windows(value)
    except ValueError as exc:
        raise reject(key, f"{expected} ({exc})", value) from None
    return sorted(value)


STATS = Capability(
    name="stats",
    settings=(
        Setting(
            "stats_enabled",
            True,
            boolean,
            "bool",
            "Count received, started, succeeded, failed, retried, rejected, revoked and "
            "rate-limited tasks per task name on time wheels in each worker's main process, "
            "send them as ``worker-throughput`` events and report them under ``extras`` in "
            "``celery inspect stats``.",
        ),
        Setting(
            "stats_interval",
            2.0,
            number(above=0),
            "float",
            "Seconds between two ``worker-throughput`` events of a worker.",
        ),
        Setting(
            "stats_windows",
            [1, 10, 60, 3600],
            windows,
            "list[int]",
            "Windows (seconds) the counts are given over, shortest first: each at most 60 "
            "(1 s buckets) or a whole number of minutes up to 3600 (1 min buckets).",
        ),
        Setting(
            "stats_max_tasks",
            1000,
            number(minimum=1, integer=True),
            "int",
            "Task names a worker keeps figures for; events of further names are counted "
            "under ``<other>``, so foreign or unknown messages cannot grow memory without bound.",
        ),
        Setting(
            "stats_queue_figures",
            True,
            boolean,
            "bool",
            "Read, once per ``extras_stats_interval``, each queue's depth on the broker and "
            "the age of its oldest message (Redis only), for every queue the worker consumes "
            "and every queue in ``task_queues``: one broker read per queue per interval "
            "(:doc:`/queues`).",
        ),
    ),
    worker_steps=(StatsRecording,),
    consumer_steps=(TaskCounting, QueueFiguresStep, StatsEmitter),
    connect=connect_stamp,
)
