"""Consumer step sending ``worker-throughput`` events and answering ``inspect stats``.

Every ``extras_stats_interval`` seconds it sends one event of type
``worker-throughput`` with exactly the contract's fields, ``windows`` and
``tasks`` (the event dispatcher adds ``hostname``, ``timestamp``, ``clock``...),
on the consumer's timer like Celery's heartbeat. It is in the ``worker`` event
group, so it is sent whenever the worker sends events at all (heartbeats are on
by default), whether or not ``task_events`` is. Its :meth:`info` puts the same
figures under ``extras`` in ``celery inspect stats``.

The event also carries ``extras_state``, the worker's gauges read from the
``info()`` of celery-extras' other steps as :mod:`.gauges` declares them (see
:func:`worker_state`).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from ..settings import settings_of
from . import gauges
from .recorder import Recorder

__all__ = ["EVENT_TYPE", "StatsEmitter", "worker_state"]

logger = logging.getLogger(__name__)

EVENT_TYPE = "worker-throughput"


def worker_state(infos: dict[str, Any]) -> dict[str, Any]:
    """The gauges of ``extras_state`` from the merged ``info()`` of the worker's steps.

    Each entry of :data:`.gauges.GAUGES` reads its own (``store``, ``eviction``,
    ``waiting``, ``parked``, ``buffered``, ``concurrency``); only what the worker
    has is given.
    """
    state: dict[str, Any] = {}
    for gauge in gauges.GAUGES:
        value = gauge.read(infos)
        if value is not None:
            state[gauge.key] = value
    return state


class StatsEmitter(bootsteps.StartStopStep):
    """Send the recorder's figures every ``extras_stats_interval`` s; report them in ``info()``."""

    label = "extras-stats-emitter"
    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        settings = settings_of(c.app)
        self.enabled = bool(settings["stats_enabled"])
        self.interval: float = settings["stats_interval"]
        self.windows: list[int] = list(settings["stats_windows"])
        self.tref: Any = None
        self._failed = False
        super().__init__(c, **kwargs)

    @staticmethod
    def recorder(c: Any) -> Recorder | None:
        controller = getattr(c, "controller", None)
        recorder: Recorder | None = getattr(controller, "extras_stats", None)
        return recorder

    def figures(self, c: Any) -> dict[str, Any]:
        """``{"windows": [...], "tasks": {...}, "runtime_scale": {...}}`` as the event has it."""
        recorder = self.recorder(c)
        if recorder is None:
            return {"windows": self.windows, "tasks": {}}
        return recorder.snapshot(self.windows)

    def state(self, c: Any) -> dict[str, Any]:
        """The worker's gauges (:func:`worker_state`) from its other extras steps.

        Consumer steps report with the consumer, worker steps (the delay store's
        mover) with the worker.
        """
        infos: dict[str, Any] = {}
        controller = getattr(c, "controller", None)
        for parent in (controller, c):
            for step in getattr(parent, "steps", None) or ():
                if step is self or not type(step).__module__.startswith("celery_extras."):
                    continue
                info = getattr(step, "info", None)
                if info is None:
                    continue
                try:
                    found = info(parent)
                except Exception:  # a step's report must not stop the event
                    continue
                if isinstance(found, dict):
                    infos.update(found)
        return worker_state(infos)

    def emit(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        if dispatcher is None or not dispatcher.enabled:
            return
        if dispatcher.mutex.locked():  # a publish under way (a heartbeat retrying): skip
            return  # this tick rather than pile up behind it; the next sends fresher figures
        try:
            dispatcher.send(EVENT_TYPE, **self.figures(c), extras_state=self.state(c))
        except Exception:  # the next tick tries again; one log line, not one per tick
            if not self._failed:
                logger.exception("celery-extras stats: could not send %s", EVENT_TYPE)
            self._failed = True
        else:
            self._failed = False

    def start(self, c: Any) -> None:
        self.tref = c.timer.call_repeatedly(self.interval, self.emit, (c,), priority=10)

    def stop(self, c: Any) -> None:
        if self.tref is not None:
            c.timer.cancel(self.tref)
            self.tref = None

    shutdown = stop

    def info(self, c: Any) -> dict[str, Any]:
        return {"extras": self.figures(c)}
