"""Consumer step sending ``worker-throughput`` events and answering ``inspect stats``.

Every ``extras_stats_interval`` seconds it sends one event of type
``worker-throughput`` with exactly the contract's fields, ``windows`` and
``tasks`` (the event dispatcher adds ``hostname``, ``timestamp``, ``clock``...),
on the consumer's timer like Celery's heartbeat. It is in the ``worker`` event
group, so it is sent whenever the worker sends events at all (heartbeats are on
by default), whether or not ``task_events`` is. Its :meth:`info` puts the same
figures under ``extras`` in ``celery inspect stats``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from .recorder import Recorder

__all__ = ["EVENT_TYPE", "StatsEmitter"]

logger = logging.getLogger(__name__)

EVENT_TYPE = "worker-throughput"


class StatsEmitter(bootsteps.StartStopStep):
    """Send the recorder's figures every ``extras_stats_interval`` s; report them in ``info()``."""

    label = "extras-stats-emitter"
    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        from ..install import settings_of  # install imports this module

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
        """``{"windows": [...], "tasks": {...}}`` as the event carries it."""
        recorder = self.recorder(c)
        if recorder is None:
            return {"windows": self.windows, "tasks": {}}
        return recorder.snapshot(self.windows)

    def emit(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        if dispatcher is None or not dispatcher.enabled:
            return
        try:
            dispatcher.send(EVENT_TYPE, **self.figures(c))
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
