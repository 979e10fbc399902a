"""Bootsteps: one sync per worker, replacing Celery's Mingle.

:class:`NoMingle` (worker step) turns Mingle off before the consumer is built,
so the worker syncs once, through :class:`SyncStep` (consumer step): it loads
the durable store before the worker consumes a message, then leaves the
neighbours' hello and the periodic anti-entropy to the
:class:`~.syncer.Syncer`'s thread, so readiness waits for no reply.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from .. import compat
from ..settings import settings_of
from ..store.client import StoreStep
from .control import SYNCER_ATTR
from .state import WorkerRevokes
from .syncer import Syncer

__all__ = ["WITHOUT_HELLO_ATTR", "NoMingle", "SyncStep"]

#: How often (seconds) the consumer merges what the sync thread queued.
DRAIN_INTERVAL = 0.1


#: Attribute of the worker: ``True`` when it was started without Mingle (``--without-mingle``,
#: or Celery's in-process test workers): its sync then says no hello to the neighbours.
WITHOUT_HELLO_ATTR = "extras_without_hello"


class NoMingle(bootsteps.Step):
    """Worker step: disable Celery's Mingle when celery-extras sync is on (one sync, not two).
    A worker started without Mingle gets no hello either (the store sync still runs)."""

    label = "extras-no-mingle"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        if settings_of(parent.app)["sync_enabled"]:
            setattr(parent, WITHOUT_HELLO_ATTR, bool(parent.options.get("without_mingle")))
            parent.options["without_mingle"] = True


class SyncStep(bootsteps.StartStopStep):
    """Consumer step keeping the worker's revoked set and clock in sync (see the module doc)."""

    label = "extras-sync"
    requires = ("celery.worker.consumer.connection:Connection", StoreStep)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        settings = settings_of(c.app)
        self.enabled = settings["sync_enabled"]
        self.timers: list[Any] = []
        if not self.enabled:
            return
        revokes = WorkerRevokes(
            compat.worker_revoked(),
            compat.worker_revoked_stamps(),
            settings["revoke_expires"],
            newest=compat.limited_set_newest,
        )
        setattr(c, SYNCER_ATTR, Syncer(c.app, c.hostname, revokes, settings))

    def start(self, c: Any) -> None:
        syncer: Syncer = getattr(c, SYNCER_ATTR)
        syncer.load()
        self.timers = [
            c.timer.call_repeatedly(DRAIN_INTERVAL, syncer.drain),
            c.timer.call_repeatedly(syncer.interval, syncer.collect),
        ]
        syncer.start(hello=not getattr(c.controller, WITHOUT_HELLO_ATTR, False))

    def stop(self, c: Any) -> None:
        for timer in self.timers:
            timer.cancel()
        self.timers = []
        syncer: Syncer | None = getattr(c, SYNCER_ATTR, None)
        if syncer is not None:
            syncer.stop()

    def shutdown(self, c: Any) -> None:
        self.stop(c)

    def info(self, c: Any) -> dict[str, Any]:
        syncer: Syncer | None = getattr(c, SYNCER_ATTR, None)
        return {"extras_sync": syncer.info() if syncer is not None else {"enabled": False}}
