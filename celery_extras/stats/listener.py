"""The monitor side: a thread consuming ``worker-throughput`` events into a shared state.

:class:`ClusterState` keeps the latest figures of each worker (thread-safe) and
counts events it had to drop; :class:`Listener` feeds it from the app's event
exchange in a background thread, reconnecting after broker errors. Both
``extras top`` and the Prometheus collector read the state. A malformed or
undecodable event is dropped, counted, and logged once per sender, never raised.
:class:`LiveState`, the state in Flower's process, also keeps a short history of
cluster-wide running totals for the Flower page's charts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from celery import Celery

from ..compat import DroppingEventReceiver
from .emitter import EVENT_TYPE
from .schema import Malformed, Throughput, parse

__all__ = ["DONE", "ClusterState", "Listener", "LiveState"]

logger = logging.getLogger(__name__)
_MAX_LOGGED_SOURCES = 1000
#: Counters whose sum is the "finished" rate: every run that ended.
DONE = ("succeeded", "failed", "retried", "rejected", "ignored")
_HISTORY = 3700  # samples kept (at most one a second): a little over the hour chart


class ClusterState:
    """The latest :class:`Throughput` of each worker, and how many events were dropped."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._workers: dict[str, tuple[Throughput, float]] = {}
        self.received = 0
        self.malformed = 0
        self._logged: set[str] = set()

    def on_event(self, event: Any) -> None:
        """Handle one event of any type; only ``worker-throughput``/``-offline`` matter."""
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "worker-offline":
            hostname = event.get("hostname")
            if isinstance(hostname, str):
                with self._lock:
                    self._workers.pop(hostname, None)
            return
        if kind != EVENT_TYPE:
            return
        try:
            figures = parse(event)
        except Malformed as exc:
            source = event.get("hostname") if isinstance(event, dict) else None
            self.drop(source if isinstance(source, str) else "<unknown>", str(exc))
            return
        with self._lock:
            self.received += 1
            self._workers[figures.hostname] = (figures, self.clock())

    def drop(self, source: str, reason: str) -> None:
        """Count a dropped event; log the first one of each sender."""
        with self._lock:
            self.malformed += 1
            first = source not in self._logged and len(self._logged) < _MAX_LOGGED_SOURCES
            if first:
                self._logged.add(source)
        if first:
            logger.warning(
                "celery-extras stats: dropped a malformed %s event from %.200s: %s "
                "(further ones from it are only counted)",
                EVENT_TYPE,
                source,
                reason,
            )

    def latest(self, max_age: float | None = None) -> dict[str, tuple[Throughput, float]]:
        """Per worker, its latest figures and when they arrived (:attr:`clock` time)."""
        now = self.clock()
        with self._lock:
            return {
                host: (figures, seen)
                for host, (figures, seen) in sorted(self._workers.items())
                if max_age is None or now - seen <= max_age
            }

    def seed(self, figures: Throughput) -> None:
        """Take *figures* (e.g. from ``inspect stats``) unless an event of the worker came."""
        with self._lock:
            self._workers.setdefault(figures.hostname, (figures, self.clock()))

    def workers(self, max_age: float | None = None) -> dict[str, Throughput]:
        """The latest figures per worker, leaving out workers silent for *max_age* s."""
        now = self.clock()
        with self._lock:
            return {
                host: figures
                for host, (figures, seen) in sorted(self._workers.items())
                if max_age is None or now - seen <= max_age
            }


class LiveState(ClusterState):
    """A :class:`ClusterState` that also samples cluster-wide running totals per task.

    At most one sample a second, when an event arrives: ``(time, {task: (finished,
    failed)})``, summed over the workers then known, for the Flower page's live charts.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.history: deque[tuple[float, dict[str, tuple[int, int]]]] = deque(maxlen=_HISTORY)
        self._sampled = -math.inf

    def on_event(self, event: Any) -> None:
        super().on_event(event)
        now = self.clock()
        if now - self._sampled < 1.0:
            return
        sums: dict[str, tuple[int, int]] = {}
        for figures in self.workers(60.0).values():
            for name, task in figures.tasks.items():
                if task.totals is None:
                    continue
                done = sum(task.totals[c] for c in DONE)
                had = sums.get(name, (0, 0))
                sums[name] = (had[0] + done, had[1] + task.totals["failed"])
        if sums:
            self._sampled = now
            with self._lock:
                self.history.append((now, sums))

    def samples(self) -> list[tuple[float, dict[str, tuple[int, int]]]]:
        """The history so far, oldest first (a copy)."""
        with self._lock:
            return list(self.history)


class _Receiver(DroppingEventReceiver):
    """An event receiver that drops what it cannot decode instead of dying on it."""

    state: ClusterState
    consuming: threading.Event

    def on_consume_ready(self, *args: Any, **kwargs: Any) -> None:
        super().on_consume_ready(*args, **kwargs)
        self.consuming.set()

    def receive_events(self, body: Any, message: Any) -> None:
        for event in body if isinstance(body, list) else [body]:
            try:
                self.process(*self.event_from_message(event))
            except Exception as exc:
                source = event.get("hostname") if isinstance(event, dict) else None
                self.state.drop(source if isinstance(source, str) else "<unknown>", repr(exc))


class Listener(threading.Thread):
    """Consume the app's worker events into *state* until :meth:`stop`."""

    def __init__(self, app: Celery, state: ClusterState, wakeup: bool = True) -> None:
        super().__init__(name="celery-extras-stats-listener", daemon=True)
        self.app = app
        self.state = state
        self.wakeup = wakeup
        self.ready = threading.Event()
        self._stopping = threading.Event()
        self._receiver: _Receiver | None = None

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                with self.app.connection_for_read() as conn:
                    receiver = _Receiver(
                        conn,
                        handlers={"*": self.state.on_event},
                        routing_key="worker.#",
                        app=self.app,
                        accept={"json"},
                    )
                    receiver.state = self.state
                    receiver.consuming = self.ready
                    self._receiver = receiver
                    if self._stopping.is_set():
                        return
                    receiver.capture(limit=None, timeout=None, wakeup=self.wakeup)
            except Exception as exc:
                if self._stopping.is_set():
                    return
                logger.warning("celery-extras stats: event connection lost (%r); retrying", exc)
                self._stopping.wait(1.0)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self._receiver is not None:
            self._receiver.should_stop = True
        self.join(timeout)
