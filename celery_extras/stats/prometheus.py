"""Prometheus: a collector of the workers' ``worker-throughput`` figures, in Flower or alone.

Metrics (gauges: each is the count over a sliding window, not a running total):

* ``celery_extras_task_events{worker, task, window, counter}``: tasks counted
  over the last ``window`` seconds (``received``, ``succeeded``, ...).
* ``celery_extras_task_runtime_seconds{worker, task, stat}``: runtime ``count``,
  ``sum``, ``max``, ``p50``, ``p95``, ``p99`` over the worker's longest window.
* ``celery_extras_malformed_events_total``: events dropped as malformed.

In Flower's process, one line in ``flowerconfig.py`` (``celery -A proj flower
--conf=flowerconfig.py``)::

    from celery_extras.stats.prometheus import in_flower; in_flower()

and Flower's ``/metrics`` has them. Alone: ``celery -A proj extras exporter --port 9808``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

from celery import Celery
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .listener import ClusterState, Listener
from .schema import RUNTIME_FIELDS

__all__ = ["ThroughputCollector", "collect_into", "in_flower", "serve"]


class ThroughputCollector:
    """A Prometheus collector reading the latest figures of each worker from *state*."""

    def __init__(self, state: ClusterState, max_age: float = 60.0) -> None:
        self.state = state
        self.max_age = max_age

    def describe(self) -> list[Any]:
        return []  # no collect() at registration time

    def collect(self) -> Iterator[Any]:
        events = GaugeMetricFamily(
            "celery_extras_task_events",
            "Tasks counted by celery-extras over the last `window` seconds",
            labels=["worker", "task", "window", "counter"],
        )
        runtime = GaugeMetricFamily(
            "celery_extras_task_runtime_seconds",
            "Task runtime figures over the worker's longest window",
            labels=["worker", "task", "stat"],
        )
        for worker, figures in self.state.workers(self.max_age).items():
            windows = [f"{w:g}" for w in figures.windows]
            for task, task_figures in figures.tasks.items():
                for counter, row in task_figures.counts.items():
                    for window, n in zip(windows, row, strict=True):
                        events.add_metric([worker, task, window, counter], n)
                for stat in RUNTIME_FIELDS:
                    value = task_figures.runtime.get(stat)
                    if value is not None:
                        runtime.add_metric([worker, task, stat], value)
        yield events
        yield runtime
        yield CounterMetricFamily(
            "celery_extras_malformed_events",
            "worker-throughput events dropped as malformed",
            value=self.state.malformed,
        )


def collect_into(
    app: Celery, registry: CollectorRegistry = REGISTRY
) -> tuple[ThroughputCollector, Listener]:
    """Start a listener on *app*'s events and register its collector in *registry*."""
    state = ClusterState()
    listener = Listener(app, state)
    listener.start()
    collector = ThroughputCollector(state)
    registry.register(collector)
    return collector, listener


def _flower_app() -> Celery:
    import click
    from celery import current_app

    ctx = click.get_current_context(silent=True)
    app = getattr(getattr(ctx, "obj", None), "app", None) if ctx is not None else None
    return app if isinstance(app, Celery) else current_app


_in_flower: tuple[ThroughputCollector, Listener] | None = None


def in_flower(app: Celery | None = None) -> ThroughputCollector:
    """For ``flowerconfig.py``: collect into the default registry Flower serves on /metrics."""
    global _in_flower
    if _in_flower is None:
        _in_flower = collect_into(app or _flower_app(), REGISTRY)
    return _in_flower[0]


def serve(app: Celery, port: int, address: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` on *address*:*port* until interrupted (``extras exporter``)."""
    registry = CollectorRegistry()
    _, listener = collect_into(app, registry)
    server, thread = start_http_server(port, addr=address, registry=registry)
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
