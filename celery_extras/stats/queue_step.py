"""Consumer step keeping the worker's queue figures, read once per stats tick.

For every queue the worker consumes and every queue in ``task_queues``: its depth on
the broker and the age of its oldest message (:mod:`.queue_reader`: one broker read per
queue per tick), and the messages of it buffered in this worker (prefetched, not yet
running, plus what the fair consumer holds). A thread of its own reads the broker every
``extras_stats_interval`` seconds on a connection of its own, so the worker's loop never
waits on the broker for them; :meth:`QueueFiguresStep.info` gives the last reading as
``extras_queue_figures`` (``inspect stats``, and the ``queues`` gauge of the events).
Off with ``extras_stats_queue_figures = False``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps
from celery.worker.consumer.tasks import Tasks

from .. import compat
from ..clock import wall
from ..delay.entry import DUE_SUFFIX
from ..settings import settings_of
from ..threads import FORK_GATE, start_thread
from .queue_reader import READABLE, Figures, QueueReader, reader_for

__all__ = ["INFO_KEY", "QueueFiguresStep", "buffered_by_queue"]

logger = logging.getLogger(__name__)

INFO_KEY = "extras_queue_figures"
#: Seconds a broker read may take before it counts as failed.
READ_TIMEOUT = 2.0


def buffered_by_queue(requests: Any, running: Any, routes: dict[str, str]) -> dict[str, int]:
    """Requests of *requests* not in *running*, counted by the queue their routing key
    names (*routes*: routing key -> queue)."""
    counts: dict[str, int] = {}
    for request in list(requests):
        if request in running:
            continue
        info = getattr(request, "delivery_info", None) or {}
        queue = routes.get(str(info.get("routing_key") or ""))
        if queue is not None:
            counts[queue] = counts.get(queue, 0) + 1
    return counts


def _timeouts(driver: str) -> dict[str, float]:
    if driver == "redis":
        return {"socket_timeout": READ_TIMEOUT, "socket_connect_timeout": READ_TIMEOUT}
    return {"read_timeout": READ_TIMEOUT, "write_timeout": READ_TIMEOUT}


class QueueFiguresStep(bootsteps.StartStopStep):
    """Reads the queues' figures every stats tick in a thread; reports the last reading."""

    label = "extras-queue-figures"
    requires = (Tasks,)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        settings = settings_of(c.app)
        self.enabled = bool(settings["stats_enabled"] and settings["stats_queue_figures"])
        self.interval: float = settings["stats_interval"]
        self.queues: list[str] = []
        self.routes: dict[str, str] = {}
        self.figures: dict[str, Figures] = {}
        self.read_at: float | None = None
        self.reads = 0  # broker reads made, for the figures' cost
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        consumed = [q.name for q in getattr(c.task_consumer, "queues", None) or ()]
        declared = list(c.app.amqp.queues)  # task_queues (else the default queue)
        # a due queue (the delay store's released tasks) counts with the store's parked
        named = dict.fromkeys([*consumed, *declared])
        self.queues = [name for name in named if not name.endswith(DUE_SUFFIX)]
        self.routes = {str(q.routing_key or q.name): q.name for q in c.app.amqp.queues.values()}
        self.routes.update({name: name for name in self.queues})
        if self._thread is None:
            stopped = self._stopped = threading.Event()
            self._thread = start_thread(
                lambda: self._run(c.app, stopped), "celery-extras-queue-figures"
            )

    def stop(self, c: Any) -> None:
        self._stopped.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(READ_TIMEOUT * 2)

    shutdown = stop

    @staticmethod
    def _connect(app: Any) -> QueueReader | None:
        driver = getattr(app.connection_for_read().transport, "driver_type", "")
        connection = app.connection_for_read(transport_options=_timeouts(driver))
        return reader_for(connection, wall)

    def _run(self, app: Any, stopped: threading.Event) -> None:
        if getattr(app.connection_for_read().transport, "driver_type", "") not in READABLE:
            return  # a transport with no reader (memory, filesystem...): nothing to read
        reader: list[QueueReader | None] = [None]
        while not stopped.is_set():
            with FORK_GATE.operation():
                self.read_once(app, reader)
            stopped.wait(self.interval)
        if reader[0] is not None:
            reader[0].close()

    def read_once(self, app: Any, reader: list[QueueReader | None]) -> None:
        """One reading of every queue (one broker read each) with *reader*'s one reader
        (made at the first, and again after a failure); a failure is logged once."""
        try:
            if reader[0] is None:
                reader[0] = self._connect(app)
            current = reader[0]
            if current is None:
                return
            self.figures = current.read(self.queues)
            self.reads += len(self.queues)
            self.read_at = wall()
            self._failed = False
        except Exception as exc:  # the broker's trouble: the next tick asks again
            if not self._failed:
                logger.warning("celery-extras: queue figures not read (%r)", exc)
            self._failed = True
            if reader[0] is not None:
                reader[0].close()
                reader[0] = None

    def info(self, c: Any) -> dict[str, Any]:
        buffered = buffered_by_queue(
            compat.reserved_requests(), compat.active_requests(), self.routes
        )
        queues: dict[str, dict[str, Any]] = {}
        for name in self.queues:
            entry: dict[str, Any] = dict(self.figures.get(name, {}))
            entry["buffered"] = buffered.get(name, 0)
            queues[name] = entry
        return {INFO_KEY: {"queues": queues, "read_at": self.read_at, "reads": self.reads,
                           "interval": self.interval}}  # fmt: skip
