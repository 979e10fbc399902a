"""Worker step that counts what the worker's main process sees, into a :class:`Recorder`.

Where each counter comes from (all in the main process, for every pool):

* ``received``: Celery's ``task_received`` signal (sent by the task strategy).
* ``revoked``: ``task_revoked`` (discarded at receipt or execution, or terminated).
* ``rate_limited``: :data:`celery_extras.signals.task_rate_limited`.
* ``rejected``: a task raising :class:`~celery.exceptions.Reject`, a lost worker
  with ``reject_on_worker_lost``, and ``task_unknown``/``task_rejected`` messages.
* ``started``, ``succeeded``, ``failed``, ``retried`` and runtimes: the callbacks
  the pool calls for each request (accepted, result, error). The step wraps the
  pool's ``apply_async`` to see them, so it composes with any ``Task.Request``
  class, any ``Task.Strategy`` and any task consumer that dispatches through the
  worker's strategies.

None of this depends on ``task_events``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Celery, bootsteps, signals
from celery.exceptions import Ignore, Reject, Retry, Terminated, WorkerLostError
from celery.worker.request import Request

from ..signals import task_rate_limited
from .recorder import (
    FAILED,
    RATE_LIMITED,
    RECEIVED,
    REJECTED,
    RETRIED,
    REVOKED,
    STARTED,
    SUCCEEDED,
    LockedRecorder,
    Recorder,
)

__all__ = ["INVALID", "StatsRecording", "track_pool"]

logger = logging.getLogger(__name__)

#: Name under which messages that are not tasks at all (``task_rejected``) are counted.
INVALID = "<invalid>"


def _exception(exc_info: Any) -> BaseException | None:
    exc = getattr(exc_info, "exception", None)
    inner = getattr(exc, "exc", None)  # billiard's ExceptionWithTraceback
    if isinstance(inner, BaseException):
        return inner
    return exc if isinstance(exc, BaseException) else None


class _Outcome:
    """The pool callbacks of one request, counting before handing over to Celery's."""

    __slots__ = ("accepted", "errored", "name", "recorder", "request", "returned")

    def __init__(self, recorder: Recorder, request: Request, options: dict[str, Any]) -> None:
        self.recorder = recorder
        self.request = request
        self.name: str = request.name
        self.accepted: Callable[..., Any] | None = options.get("accept_callback")
        self.returned: Callable[..., Any] = options["callback"]
        self.errored: Callable[..., Any] | None = options.get("error_callback")

    def on_accepted(self, *args: Any, **kwargs: Any) -> Any:
        self.recorder.count(self.name, STARTED)
        if self.accepted is not None:
            return self.accepted(*args, **kwargs)
        return None

    def on_returned(self, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        try:
            failed, retval, runtime = failed__retval__runtime
            if not failed:
                self.recorder.count(self.name, SUCCEEDED)
                if isinstance(runtime, int | float):
                    self.recorder.runtime(self.name, runtime)
            else:
                self._count_failure(_exception(retval))
        except Exception:  # never let counting break Celery's own handling
            logger.exception("celery-extras stats: could not count the outcome of %s", self.name)
        return self.returned(failed__retval__runtime, **kwargs)

    def on_error(self, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            exc = _exception(exc_info)
            if not isinstance(exc, Terminated):  # revoked with terminate: task_revoked counts it
                task = self.request.task
                if isinstance(exc, WorkerLostError) and task.acks_late:
                    lost_rejects = task.reject_on_worker_lost
                    self.recorder.count(self.name, REJECTED if lost_rejects else FAILED)
                else:
                    self._count_failure(exc)
        except Exception:
            logger.exception("celery-extras stats: could not count the failure of %s", self.name)
        if self.errored is not None:
            return self.errored(exc_info, *args, **kwargs)
        return None

    def _count_failure(self, exc: BaseException | None) -> None:
        if isinstance(exc, Retry):
            self.recorder.count(self.name, RETRIED)
        elif isinstance(exc, Reject):
            self.recorder.count(self.name, REJECTED)
        elif isinstance(exc, Ignore | SystemExit | KeyboardInterrupt):
            return
        else:
            self.recorder.count(self.name, FAILED)


def track_pool(pool: Any, recorder: Recorder) -> Callable[[], None]:
    """Wrap *pool*'s ``apply_async`` to count each request's outcome; return the undo."""
    apply_async = pool.apply_async

    def tracked_apply_async(
        target: Any, args: Any = None, kwargs: Any = None, **options: Any
    ) -> Any:
        request = getattr(options.get("callback"), "__self__", None)
        if isinstance(request, Request):
            outcome = _Outcome(recorder, request, options)
            options["accept_callback"] = outcome.on_accepted
            options["callback"] = outcome.on_returned
            options["error_callback"] = outcome.on_error
        return apply_async(target, args, kwargs, **options)

    pool.apply_async = tracked_apply_async

    def undo() -> None:
        if pool.__dict__.get("apply_async") is tracked_apply_async:
            del pool.apply_async

    return undo


class _Receivers:
    """The signal receivers of one worker's recorder, acting only for its app."""

    def __init__(self, app: Celery, recorder: Recorder) -> None:
        self.app = app
        self.recorder = recorder
        uid = f"celery_extras.stats.{id(self)}"
        self.connections = [
            (signals.task_received, self.on_received, f"{uid}.received"),
            (signals.task_revoked, self.on_revoked, f"{uid}.revoked"),
            (signals.task_unknown, self.on_unknown, f"{uid}.unknown"),
            (signals.task_rejected, self.on_rejected, f"{uid}.rejected"),
            (task_rate_limited, self.on_rate_limited, f"{uid}.rate_limited"),
        ]

    def connect(self) -> None:
        for signal, receiver, uid in self.connections:
            signal.connect(receiver, weak=False, dispatch_uid=uid)

    def disconnect(self) -> None:
        for signal, receiver, uid in self.connections:
            signal.disconnect(receiver, dispatch_uid=uid)

    def on_received(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "app", None) is self.app and request is not None:
            self.recorder.count(request.name, RECEIVED)

    def on_revoked(self, sender: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            self.recorder.count(sender.name, REVOKED)

    def on_unknown(self, sender: Any = None, name: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            self.recorder.count(str(name)[:200], REJECTED)

    def on_rejected(self, sender: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            self.recorder.count(INVALID, REJECTED)

    def on_rate_limited(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        app = getattr(request, "app", None) if request is not None else None
        if isinstance(sender, str) and (app is None or app is self.app):
            self.recorder.count(sender, RATE_LIMITED)


class StatsRecording(bootsteps.StartStopStep):
    """Counts received/started/.../rate-limited per task name in the worker's main process.

    Sets ``worker.extras_stats`` to the :class:`Recorder` (a locked one when pool
    callbacks may run in other threads: no event loop, e.g. threads, gevent, eventlet).
    """

    label = "extras-stats"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, w: Any, **kwargs: Any) -> None:
        from ..install import settings_of  # install imports this module

        settings = settings_of(w.app)
        self.enabled = bool(settings["stats_enabled"])
        self.max_tasks: int = settings["stats_max_tasks"]
        self._undo: Callable[[], None] | None = None
        self._receivers: _Receivers | None = None
        w.extras_stats = None
        super().__init__(w, **kwargs)

    def create(self, w: Any) -> None:
        recorder_cls = Recorder if w.use_eventloop else LockedRecorder
        w.extras_stats = recorder_cls(max_tasks=self.max_tasks)

    def start(self, w: Any) -> None:
        recorder: Recorder = w.extras_stats
        self._undo = track_pool(w.pool, recorder)
        self._receivers = _Receivers(w.app, recorder)
        self._receivers.connect()

    def stop(self, w: Any) -> None:
        if self._receivers is not None:
            self._receivers.disconnect()
            self._receivers = None
        if self._undo is not None:
            self._undo()
            self._undo = None

    shutdown = stop
