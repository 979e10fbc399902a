"""Consumer step keeping the worker's queue figures, read once per stats tick.

For every queue the worker consumes and every queue in ``task_queues``: its depth on
the broker and the age of its oldest message (:mod:`.queue_reader`: one broker read per
queue per tick), what the delay store holds for it (entries not yet taken, from the counts
the store keeps: :meth:`.RedisDelayStore.parked_by_queue`, one read per shard per tick,
never a walk of the entries; left out where the app has no store or it did not answer),
and the messages of it buffered in this worker (prefetched, not yet running, plus what the
fair consumer holds). A thread of its own reads the broker and the store every
``extras_stats_interval`` seconds on connections of its own, so the worker's loop never
waits on either for them; :meth:`QueueFiguresStep.info` gives the last reading as
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
from ..delay.parking import Parker
from ..delay.redis_store import RedisDelayStore
from ..settings import settings_of
from ..store.client import store_url
from ..threads import FORK_GATE, start_thread
from .queue_reader import READABLE, Figures, QueueReader, reader_for

__all__ = ["INFO_KEY", "QueueFiguresStep", "buffered_by_queue", "parked_by_queue"]

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


def parked_by_queue(counts: dict[str, int], queues: list[str], routes: dict[str, str]
                    ) -> dict[str, int]:  # fmt: skip
    """The store's *counts* (by the queue an entry records, else its routing key) per queue
    of *queues*, a routing key counted for the queue it names in *routes*; counts for
    queues this worker does not know are left out."""
    out: dict[str, int] = {}
    for name, n in counts.items():
        queue = name if name in queues else routes.get(name)
        if queue is not None:
            out[queue] = out.get(queue, 0) + n
    return out


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
        self.parked: dict[str, int] | None = None  # the store's counts per queue, when read
        self.store_reads = 0  # store reads made (one per shard per tick), for the cost
        self._store_failed = False
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

    @staticmethod
    def _store(app: Any) -> RedisDelayStore | None:
        """The app's delay store (its own client, off the loop), or ``None`` without one."""
        if store_url(app) is None:
            return None
        try:
            store = Parker(app, background=True).store
        except Exception as exc:  # a store setting that cannot work: no counts, said once
            logger.warning("celery-extras: parked counts not read (%r)", exc)
            return None
        return store if isinstance(store, RedisDelayStore) else None

    def _run(self, app: Any, stopped: threading.Event) -> None:
        readable = getattr(app.connection_for_read().transport, "driver_type", "") in READABLE
        store = self._store(app)
        if not readable and store is None:
            return  # a transport with no reader (memory, filesystem...) and no store
        reader: list[QueueReader | None] = [None]
        while not stopped.is_set():
            with FORK_GATE.operation():
                if readable:
                    self.read_once(app, reader)
                if store is not None:
                    self.read_parked(store)
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

    def read_parked(self, store: RedisDelayStore) -> None:
        """The store's counts per queue (one read per shard); a failure is logged once and
        leaves them unknown until the store answers."""
        try:
            counts = store.parked_by_queue()
            self.store_reads += len(store.shards())
        except Exception as exc:  # the store's trouble (STORE_ERRORS): the next tick asks
            if not self._store_failed:
                logger.warning("celery-extras: parked counts not read (%r)", exc)
            self._store_failed = True
            self.parked = None
            return
        self.parked = parked_by_queue(counts, self.queues, self.routes)
        self._store_failed = False

    def info(self, c: Any) -> dict[str, Any]:
        buffered = buffered_by_queue(
            compat.reserved_requests(), compat.active_requests(), self.routes
        )
        parked = self.parked
        queues: dict[str, dict[str, Any]] = {}
        for name in self.queues:
            entry: dict[str, Any] = dict(self.figures.get(name, {}))
            entry["buffered"] = buffered.get(name, 0)
            if parked is not None:
                entry["parked"] = parked.get(name, 0)
            queues[name] = entry
        return {INFO_KEY: {"queues": queues, "read_at": self.read_at, "reads": self.reads,
                           "store_reads": self.store_reads, "interval": self.interval}}  # fmt: skip
