"""Worker steps that count what the worker's main process sees, into a :class:`Recorder`.

Where each counter comes from (all in the main process, for every pool):

* ``received``: each message handed to its task's strategy
  (:func:`~.outcomes.counting_strategy`).
* ``started``, ``succeeded``, ``failed``, ``retried`` and runtimes, and ``rejected``
  for a task raising :class:`~celery.exceptions.Reject` or lost with
  ``reject_on_worker_lost``: the request's pool callbacks, through the
  consumer's request hook (:class:`~.outcomes.OutcomeCounter`).
* ``revoked``: ``task_revoked`` (discarded at receipt or execution, or terminated).
* ``succeeded``, ``failed``, ``revoked`` too: a covered message (coalesced) that ended
  with its covering run's outcome (:data:`~celery_extras.signals.task_covered_ended`,
  sent by the worker that ended it).
* ``succeeded``, ``failed`` too: each call of a batch (``batch()``), as it ends; ``batched``:
  each batch, as it goes to the pool (:data:`~celery_extras.signals.task_batched`).
* ``rate_limited``, ``parked``, ``released``, ``concurrency_limited``, ``coalesced``,
  ``shadow_limited``, ``debounced``, ``memoized``:
  the signals of :mod:`celery_extras.signals` of those names.
* ``ignored``: a task raising :class:`~celery.exceptions.Ignore` (the pool callbacks).
* ``rejected`` too: messages of unknown tasks (``task_unknown``) and messages Celery
  cannot take as tasks (``task_rejected``).

None of this depends on ``task_events``.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, bootsteps, signals
from celery.concurrency.thread import TaskPool as ThreadPool
from celery.worker.consumer.tasks import Tasks

from .. import compat
from ..admission.request_hook import request_hook
from ..settings import settings_of
from ..signals import (
    task_batched,
    task_coalesced,
    task_concurrency_limited,
    task_covered_ended,
    task_debounced,
    task_memoized,
    task_parked,
    task_rate_limited,
    task_released,
    task_shadow_limited,
)
from .outcomes import OutcomeCounter, counting_strategy
from .recorder import (
    BATCHED,
    COALESCED,
    CONCURRENCY_LIMITED,
    DEBOUNCED,
    FAILED,
    MEMOIZED,
    PARKED,
    RATE_LIMITED,
    REJECTED,
    RELEASED,
    REVOKED,
    SHADOW_LIMITED,
    SUCCEEDED,
    LockedRecorder,
    Recorder,
)

__all__ = ["INVALID", "StatsRecording", "TaskCounting"]

#: Name under which messages naming no task (``task_rejected``) are counted.
INVALID = "<invalid>"


class _Receivers:
    """The signal receivers of one worker's recorder, acting only for its app."""

    def __init__(self, app: Celery, recorder: Recorder) -> None:
        self.app = app
        self.recorder = recorder
        uid = f"celery_extras.stats.{id(self)}"
        self.connections = [
            (signals.task_revoked, self.on_revoked, f"{uid}.revoked"),
            (signals.task_unknown, self.on_unknown, f"{uid}.unknown"),
            (signals.task_rejected, self.on_rejected, f"{uid}.rejected"),
            (task_rate_limited, self.on_rate_limited, f"{uid}.rate_limited"),
            (task_parked, self.on_parked, f"{uid}.parked"),
            (task_released, self.on_released, f"{uid}.released"),
            (task_concurrency_limited, self.on_concurrency_limited, f"{uid}.concurrency"),
            (task_coalesced, self.on_coalesced, f"{uid}.coalesced"),
            (task_covered_ended, self.on_covered_ended, f"{uid}.covered_ended"),
            (task_batched, self.on_batched, f"{uid}.batched"),
            (task_shadow_limited, self.on_shadow_limited, f"{uid}.shadow_limited"),
            (task_debounced, self.on_debounced, f"{uid}.debounced"),
            (task_memoized, self.on_memoized, f"{uid}.memoized"),
        ]

    def connect(self) -> None:
        for signal, receiver, uid in self.connections:
            signal.connect(receiver, weak=False, dispatch_uid=uid)

    def disconnect(self) -> None:
        for signal, receiver, uid in self.connections:
            signal.disconnect(receiver, dispatch_uid=uid)

    def on_revoked(self, sender: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            self.recorder.count(sender.name, REVOKED)

    def on_unknown(self, sender: Any = None, name: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            self.recorder.count(str(name)[:200], REJECTED)

    def on_rejected(self, sender: Any = None, message: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            headers = getattr(message, "headers", None)
            name = headers.get("task") if isinstance(headers, dict) else None
            self.recorder.count(name if isinstance(name, str) else INVALID, REJECTED)

    def _count_named(self, sender: Any, request: Any, counter: int) -> None:
        """Count *counter* of task *sender* (a name), if *request* is of this app or None."""
        app = getattr(request, "app", None) if request is not None else None
        if isinstance(sender, str) and (app is None or app is self.app):
            self.recorder.count(sender, counter)

    def on_rate_limited(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        self._count_named(sender, request, RATE_LIMITED)

    def on_parked(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        self._count_named(sender, request, PARKED)

    def on_released(self, sender: Any = None, **kwargs: Any) -> None:
        self._count_named(sender, None, RELEASED)

    def on_concurrency_limited(
        self, sender: Any = None, request: Any = None, **kwargs: Any
    ) -> None:
        self._count_named(sender, request, CONCURRENCY_LIMITED)

    def on_coalesced(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        self._count_named(sender, request, COALESCED)

    def on_covered_ended(self, sender: Any = None, state: Any = None, **kwargs: Any) -> None:
        """A covered message ended with its run's outcome: counted as that outcome (no
        runtime: it did not run)."""
        counter = {"SUCCESS": SUCCEEDED, "FAILURE": FAILED, "REVOKED": REVOKED}.get(state)
        if counter is not None:
            self._count_named(sender, None, counter)

    def on_batched(self, sender: Any = None, **kwargs: Any) -> None:
        """A batch went to the pool (its calls are counted as they end)."""
        self._count_named(sender, None, BATCHED)

    def on_shadow_limited(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        self._count_named(sender, request, SHADOW_LIMITED)

    def on_debounced(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        self._count_named(sender, request, DEBOUNCED)

    def on_memoized(self, sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        self._count_named(sender, request, MEMOIZED)


class StatsRecording(bootsteps.StartStopStep):
    """Keeps the worker's :class:`Recorder` and counts what arrives by signal.

    Sets ``worker.extras_stats`` to the recorder: a locked one when pool callbacks
    may run in other threads than the consumer's (the threads pool, or no event
    loop: gevent, eventlet, or a transport without one).
    """

    label = "extras-stats"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, w: Any, **kwargs: Any) -> None:
        settings = settings_of(w.app)
        self.enabled = bool(settings["stats_enabled"])
        self.max_tasks: int = settings["stats_max_tasks"]
        self._receivers: _Receivers | None = None
        w.extras_stats = None
        super().__init__(w, **kwargs)

    def create(self, w: Any) -> None:
        threaded = not w.use_eventloop or isinstance(w.pool, ThreadPool)
        recorder_cls = LockedRecorder if threaded else Recorder
        w.extras_stats = recorder_cls(max_tasks=self.max_tasks)

    def start(self, w: Any) -> None:
        self._receivers = _Receivers(w.app, w.extras_stats)
        self._receivers.connect()

    def stop(self, w: Any) -> None:
        if self._receivers is not None:
            self._receivers.disconnect()
            self._receivers = None

    shutdown = terminate = stop  # the in-process test worker ends with terminate


class TaskCounting(bootsteps.StartStopStep):
    """Counts each task message as received and each request's outcome, on the consumer.

    Hooks every request on its way to the pool (the consumer's ``on_task_request``,
    wrapped once before the strategies take it) and, while the consumer runs, wraps the
    strategies Celery built at its start.
    """

    label = "extras-stats-counting"
    requires = (Tasks,)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        controller = getattr(c, "controller", None)
        self.recorder: Recorder | None = getattr(controller, "extras_stats", None)
        self.enabled = self.recorder is not None
        self._strategies: dict[str, Any] = {}
        super().__init__(c, **kwargs)

    def create(self, c: Any) -> None:
        assert self.recorder is not None
        hook = request_hook(c)
        hook.listen(outcomes=OutcomeCounter(self.recorder))
        hook.wrap(c)

    def start(self, c: Any) -> None:
        self._wrap(c)
        compat.on_strategies_rebuilt(c, self._wrap)

    def _wrap(self, c: Any) -> None:
        assert self.recorder is not None
        request_hook(c).forget()  # the request classes of the strategies Celery replaced
        self._strategies = dict(c.strategies)
        for name, strategy in self._strategies.items():
            c.strategies[name] = counting_strategy(name, strategy, self.recorder)

    def stop(self, c: Any) -> None:
        compat.on_strategies_rebuilt(c, self._wrap, on=False)
        c.strategies.update(self._strategies)
        self._strategies = {}

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        hook = request_hook(c)
        hook.listen(outcomes=None)
        hook.unwrap(c)
