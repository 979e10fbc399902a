"""Prometheus: a collector of the workers' ``worker-throughput`` figures, in Flower or alone.

Following Prometheus' conventions (labels ``worker`` and ``task`` on each):

* ``celery_extras_tasks_total{worker, task, state}``: a counter, each stats counter
  (``state``: ``received``, ``succeeded``, ``failed``, ``retried``...) since the worker
  started, from the event's running totals; ``rate()`` and ``increase()`` work.
* ``celery_extras_task_runtime_seconds{worker, task}``: a histogram of successful
  runs since the worker started, from the worker's own log-scale buckets summed
  into the bounds :data:`BOUNDS` (two per octave, 122 us to 2.3 h; each is a bound
  of the worker's buckets, so the counts are exact), so ``histogram_quantile``
  merges workers. Its ``_count`` equals the ``succeeded`` counter.
* Gauges, from the workers' ``extras_state`` as :data:`.gauges.GAUGES` declares
  them: ``celery_extras_store_up{worker, capability}`` (1 when that capability
  of the worker reaches its store, 0 when it reports it down),
  ``celery_extras_store_evictable{worker, policy}`` (kinds of data the store's
  ``maxmemory-policy`` may evict; 0 under ``noeviction``),
  ``celery_extras_tasks_waiting{worker}`` (held for a rate limit),
  ``celery_extras_tasks_parked{worker}`` (in the delay store),
  ``celery_extras_queue_buffered{worker, queue}`` (messages the fair consumer holds),
  ``celery_extras_concurrency_holding{worker, task}`` and
  ``celery_extras_concurrency_waiting{worker, task}`` (concurrency slots held, tasks
  waiting for one), ``celery_extras_queue_prefetched{worker, queue}`` (messages of a queue
  in the worker, not yet running) and ``celery_extras_worker_last_event_age_seconds{worker}``.
* Queue figures, cluster-wide (no ``worker`` label: the largest the workers read):
  ``celery_extras_queue_depth{queue}``, ``celery_extras_queue_oldest_seconds{queue}``
  (Redis only) and ``celery_extras_queue_parked{queue}`` (what the delay store holds).
* Windowed figures, gauges named for what they are:
  ``celery_extras_window_tasks{worker, task, window, state}`` (count over the last
  ``window`` seconds) and ``celery_extras_window_runtime_seconds{worker, task,
  quantile}`` (``0.5``, ``0.95``, ``0.99`` and ``1`` for the max, over the worker's
  longest window).
* ``celery_extras_malformed_events_total``: events dropped as malformed.

Label values from events are escaped (:func:`~.text.printable`): no control
character reaches a dashboard. Workers silent for 60 s, or gone offline, are left out.

In Flower's process, one line in ``flowerconfig.py`` (``celery -A proj flower
--conf=flowerconfig.py``)::

    from celery_extras.flower import in_flower; in_flower()

and Flower's ``/metrics`` has them. Alone: ``celery -A proj extras exporter --port 9808``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from celery import Celery
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from . import gauges
from .listener import ClusterState, Listener, LiveState
from .recorder import COUNTERS
from .schema import RuntimeTotal, TaskFigures, Throughput
from .text import printable

__all__ = [
    "BOUNDS",
    "FlowerMetrics",
    "ThroughputCollector",
    "cluster_families",
    "collect_into",
    "flower_metrics",
    "histogram_buckets",
    "in_flower",
    "serve",
]

#: The ``le`` bounds of ``celery_extras_task_runtime_seconds``: 2 ** (k / 2) s, 122 us .. 2.3 h.
BOUNDS = tuple(2.0 ** (k / 2) for k in range(-26, 27))
_QUANTILES = (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"), ("1", "max"))


def histogram_buckets(runtime: RuntimeTotal) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs over :data:`BOUNDS` and ``+Inf`` for *runtime*."""
    uppers = sorted(runtime.buckets.items())
    pairs: list[tuple[str, float]] = []
    seen, i = 0, 0
    for bound in BOUNDS:
        # a worker bucket counts below `bound` when all its values are (its upper bound <= it)
        while i < len(uppers) and uppers[i][0] <= bound * (1 + 1e-12):
            seen += uppers[i][1]
            i += 1
        pairs.append((_le(bound), seen))
    pairs.append(("+Inf", runtime.count))
    return pairs


def _le(bound: float) -> str:
    return repr(float(f"{bound:.6g}"))


class ThroughputCollector:
    """A Prometheus collector reading the latest figures of each worker from *state*."""

    def __init__(self, state: ClusterState, max_age: float = 60.0) -> None:
        self.state = state
        self.max_age = max_age

    def describe(self) -> list[Any]:
        return []  # no collect() at registration time

    def collect(self) -> Iterator[Any]:
        """Every family, from the latest figures of each worker heard within :attr:`max_age`."""
        families = _WorkerFamilies.empty()
        now = self.state.clock()
        latest = self.state.latest(self.max_age)
        for worker_name, (figures, seen) in latest.items():
            families.add_worker(worker_name, figures, seen, now)
        yield from families
        yield from cluster_families([figures.state for figures, _ in latest.values()])
        yield CounterMetricFamily(
            "celery_extras_malformed_events",
            "worker-throughput events dropped as malformed",
            value=self.state.malformed,
        )


@dataclass(frozen=True)
class _WorkerFamilies:
    """The families labelled ``worker`` (and most ``task``) of one collection, filled worker
    by worker, then yielded in the order Prometheus is given them."""

    totals: CounterMetricFamily
    runtime: HistogramMetricFamily
    gauge_families: list[tuple[str, gauges.Family, GaugeMetricFamily]]
    age: GaugeMetricFamily
    window: GaugeMetricFamily
    window_runtime: GaugeMetricFamily

    @classmethod
    def empty(cls) -> _WorkerFamilies:
        """The families with no sample yet."""
        labels = ["worker", "task"]
        totals = CounterMetricFamily(
            "celery_extras_tasks",
            "Tasks counted by celery-extras since the worker started, by state",
            labels=[*labels, "state"],
        )
        runtime = HistogramMetricFamily(
            "celery_extras_task_runtime_seconds",
            "Runtime of successful runs since the worker started (the worker's own buckets)",
            labels=labels,
        )
        gauge_families = [
            (gauge.key, family, GaugeMetricFamily(
                family.name, family.help, labels=["worker", *family.labels]))
            for gauge in gauges.GAUGES
            for family in gauge.families
        ]  # fmt: skip
        age = GaugeMetricFamily(
            "celery_extras_worker_last_event_age_seconds",
            "Seconds since the worker's last worker-throughput event reached this process",
            labels=["worker"],
        )
        window = GaugeMetricFamily(
            "celery_extras_window_tasks",
            "Tasks counted over the last `window` seconds (a sliding window, not a total)",
            labels=[*labels, "window", "state"],
        )
        window_runtime = GaugeMetricFamily(
            "celery_extras_window_runtime_seconds",
            "Runtime quantiles of successful runs over the worker's longest window",
            labels=[*labels, "quantile"],
        )
        return cls(totals, runtime, gauge_families, age, window, window_runtime)

    def add_worker(self, worker_name: str, figures: Throughput, seen: float, now: float) -> None:
        """The samples of one worker's *figures*, which arrived at *seen* (*now* is now)."""
        worker = printable(worker_name)
        windows = [f"{w:g}" for w in figures.windows]
        self.age.add_metric([worker], max(0.0, now - seen))
        for task_name, task_figures in figures.tasks.items():
            self._add_task(worker, windows, printable(task_name), task_figures)
        for key, family, metric in self.gauge_families:
            gauge = figures.state.get(key)
            if gauge is not None:
                for label_values, sample in family.samples(gauge):
                    metric.add_metric([worker, *map(printable, label_values)], sample)

    def _add_task(self, worker: str, windows: list[str], task: str, figures: TaskFigures) -> None:
        """The samples of one task of *worker*: its totals, runtime histogram, counts over
        each of *windows* and runtime quantiles."""
        if figures.totals is not None:
            for counter in COUNTERS:
                self.totals.add_metric([worker, task, counter], figures.totals[counter])
        every = figures.runtime_total
        if every is not None:
            self.runtime.add_metric([worker, task], histogram_buckets(every), sum_value=every.total)
        for name, row in figures.counts.items():
            for length, n in zip(windows, row, strict=True):
                self.window.add_metric([worker, task, length, name], n)
        for quantile, stat in _QUANTILES:
            value = figures.runtime.get(stat)
            if value is not None and (stat != "max" or figures.runtime.get("count")):
                self.window_runtime.add_metric([worker, task, quantile], value)

    def __iter__(self) -> Iterator[Any]:
        """The families, in the order the collector has always yielded them."""
        yield from (self.totals, self.runtime)
        yield from (metric for _, _, metric in self.gauge_families)
        yield from (self.age, self.window, self.window_runtime)


def cluster_families(states: list[dict[str, Any]]) -> Iterator[GaugeMetricFamily]:
    """The gauges' cluster-wide families (no ``worker`` label: the queues' depth, age and
    parked tasks), from the workers' merged values."""
    for gauge in gauges.GAUGES:
        if not gauge.cluster or gauge.merge is None:
            continue
        values = [state[gauge.key] for state in states if gauge.key in state]
        merged = gauge.merge(values) if values else None
        for family in gauge.cluster:
            metric = GaugeMetricFamily(family.name, family.help, labels=list(family.labels))
            for label_values, sample in family.samples(merged) if merged is not None else ():
                metric.add_metric([printable(v) for v in label_values], sample)
            yield metric


def collect_into(
    app: Celery, registry: CollectorRegistry = REGISTRY, state: ClusterState | None = None
) -> tuple[ThroughputCollector, Listener]:
    """Start a listener on *app*'s events into *state* and register its collector in *registry*."""
    state = state if state is not None else ClusterState()
    listener = Listener(app, state)
    listener.start()
    collector = ThroughputCollector(state)
    registry.register(collector)
    return collector, listener


@dataclass(frozen=True)
class FlowerMetrics:
    """The metrics in Flower's process: one listener, state and collector, however often asked."""

    app: Celery
    state: LiveState
    listener: Listener
    collector: ThroughputCollector


_flower: FlowerMetrics | None = None
_flower_lock = threading.Lock()


def _flower_app() -> Celery:
    """The app Flower runs with (its click context's), else Celery's current app."""
    import click
    from celery import current_app

    ctx = click.get_current_context(silent=True)
    app = getattr(getattr(ctx, "obj", None), "app", None) if ctx is not None else None
    return app if isinstance(app, Celery) else current_app


def flower_metrics(app: Celery | None = None) -> FlowerMetrics:
    """The collector in the default registry (Flower's ``/metrics``), set up once per process.

    Its state is a :class:`~.listener.LiveState`, so the Flower page
    (:func:`celery_extras.flower.in_flower`) shares it, whichever comes first.
    """
    global _flower
    with _flower_lock:
        if _flower is None:
            state = LiveState()
            collector, listener = collect_into(app or _flower_app(), REGISTRY, state)
            _flower = FlowerMetrics(listener.app, state, listener, collector)
        return _flower


def in_flower(app: Celery | None = None) -> ThroughputCollector:
    """The metrics alone in Flower; :func:`celery_extras.flower.in_flower` adds the page too."""
    return flower_metrics(app).collector


def serve(app: Celery, port: int, address: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` on *address*:*port* until interrupted (``extras exporter``).

    The port is bound first: an :class:`OSError` (in use, not allowed) leaves
    nothing started behind it.
    """
    registry = CollectorRegistry()
    state = ClusterState()
    registry.register(ThroughputCollector(state))
    server, thread = start_http_server(port, addr=address, registry=registry)
    listener = Listener(app, state)
    listener.start()
    stopped = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
    try:
        while not stopped.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join(5)
        listener.stop()
