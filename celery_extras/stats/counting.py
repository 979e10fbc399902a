"""Counting a worker's tasks where its main process handles them: strategies and requests.

Two seams, both on the worker's consumer, neither touching a task:

* :func:`counting_strategy` wraps a task's strategy (an entry of the consumer's
  ``strategies``) to count ``received`` as each message reaches it, where Celery
  logs "Task ... received".
* :class:`RequestCounting` wraps the consumer's ``on_task_request``, through which
  every request goes to the pool (from the strategy, the ETA and rate-limit timers,
  and the limits of :mod:`celery_extras.policies`). It gives the request a subclass
  of its own class whose pool callbacks (``on_accepted``, ``on_success``,
  ``on_failure``) count ``started``, ``succeeded`` with the runtime, ``failed``,
  ``retried`` and ``rejected`` before calling the request's own. Swapping the class
  allocates nothing per request, so the hooks cost a few hundred nanoseconds, and
  any ``Task.Request`` class keeps its behaviour.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from celery.exceptions import (
    Ignore,
    Reject,
    Retry,
    Terminated,
    TimeLimitExceeded,
    WorkerLostError,
)
from celery.worker.request import Request

from ..compat import revoked_or_cancelled
from .recorder import (
    FAILED,
    IGNORED,
    RECEIVED,
    REJECTED,
    RETRIED,
    STARTED,
    SUCCEEDED,
    Recorder,
)

__all__ = ["REPUBLISHED_HEADERS", "RequestCounting", "counting_strategy"]

#: Headers celery-extras puts on a message it publishes again itself (a parked task
#: released by the delay store; ``extras_slot`` marked the former hand-back of a limited
#: task): such a message is the same task delivered before, not received again.
REPUBLISHED_HEADERS = ("extras_slot", "extras_parked")

logger = logging.getLogger(__name__)

Strategy = Callable[..., Any]

#: Class attribute that marks a counting request class.
_COUNTING = "_extras_counting"


def counting_strategy(name: str, strategy: Strategy, recorder: Recorder) -> Strategy:
    """*strategy* of task *name*, counting each message it is handed as received.

    A message of a revoked or expired task is received (and then revoked), a
    malformed one received (and then rejected); a shadow name counts as the
    request will (Celery names the request after it). A message celery-extras
    published again itself (:data:`REPUBLISHED_HEADERS`) is not received again.
    """
    count = recorder.count
    slot, parked = REPUBLISHED_HEADERS

    def receive(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kw: Any) -> Any:
        headers = message.headers
        if slot not in headers and parked not in headers:
            count(headers.get("shadow") or name, RECEIVED)
        return strategy(message, body, ack, reject, callbacks, **kw)

    return receive


def _exception(exc_info: Any) -> BaseException | None:
    """The exception of *exc_info*, unwrapped from billiard's wrapper only.

    (:class:`~celery.exceptions.Retry` has an ``exc`` of its own: the error retried.)
    """
    exc = getattr(exc_info, "exception", None)
    if isinstance(exc, ExceptionWithTraceback):
        exc = exc.exc
    return exc if isinstance(exc, BaseException) else None


def _failure_counter(request: Any, exc: BaseException | None) -> int | None:
    """The counter of a request that ended in *exc*, or ``None`` when it counts elsewhere.

    Follows the branches of Celery's ``Request.on_failure``, so each outcome is
    counted as what Celery does with the message.
    """
    if isinstance(exc, Terminated):  # revoked with terminate: task_revoked counts it
        return None
    if isinstance(exc, SystemExit | KeyboardInterrupt):
        if revoked_or_cancelled(request):
            return None  # killed by the terminate Celery sent: task_revoked counted it
        exc = WorkerLostError(str(exc))  # Celery treats it as a lost worker
    if isinstance(exc, Reject):
        return REJECTED
    if isinstance(exc, Ignore):
        return IGNORED
    if isinstance(exc, Retry):
        return RETRIED
    task = request.task
    lost = isinstance(exc, WorkerLostError)
    exhausted = False
    if lost and getattr(task, "retry_on_worker_lost", False):  # Celery >= 5.7
        max_retries = task.max_retries
        retries = request.request_dict.get("retries") or 0
        exhausted = max_retries is not None and retries >= max_retries
        if not exhausted:
            return RETRIED
    if task.acks_late:
        either = getattr(task, "acks_on_failure_or_timeout", True)
        if isinstance(exc, TimeLimitExceeded):
            acked = getattr(task, "acks_on_timeout", either)
            if not acked:
                return REJECTED  # requeued
        elif lost and task.reject_on_worker_lost and not exhausted:
            return REJECTED  # requeued
    return FAILED


def _counting_class(base: type[Request], recorder: Recorder) -> type[Request]:
    """A subclass of request class *base* whose pool callbacks count into *recorder*."""
    count, succeeded = recorder.count, recorder.succeeded
    base_accepted, base_success, base_failure = base.on_accepted, base.on_success, base.on_failure

    def on_accepted(self: Any, pid: Any, time_accepted: Any) -> Any:
        count(self.name, STARTED)
        return base_accepted(self, pid, time_accepted)

    def on_success(self: Any, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        # a failure goes on to on_failure, which counts it
        try:
            failed, _, runtime = failed__retval__runtime
            if not failed:
                if isinstance(runtime, (int, float)):
                    succeeded(self.name, runtime)
                else:
                    count(self.name, SUCCEEDED)
        except Exception:  # never let counting break Celery's own handling
            logger.exception("celery-extras stats: could not count the outcome of %s", self.name)
        return base_success(self, failed__retval__runtime, **kwargs)

    def on_failure(self: Any, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            counter = _failure_counter(self, _exception(exc_info))
            if counter is not None:
                count(self.name, counter)
        except Exception:
            logger.exception("celery-extras stats: could not count the failure of %s", self.name)
        return base_failure(self, exc_info, *args, **kwargs)

    namespace = {
        "__slots__": (),
        _COUNTING: True,
        "__module__": base.__module__,
        "__doc__": base.__doc__,
        "on_accepted": on_accepted,
        "on_success": on_success,
        "on_failure": on_failure,
    }
    counting: type[Request] = type(base.__name__, (base,), namespace)
    return counting


class RequestCounting:
    """Gives each request a counting subclass of its class on its way to the pool.

    One subclass per request class, made on first use; :meth:`forget` drops them
    when the consumer rebuilds its strategies (and so their request classes).
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._classes: dict[type[Request], type[Request]] = {}

    def forget(self) -> None:
        self._classes.clear()

    def _class_for(self, cls: type[Request]) -> type[Request]:
        # a counting class already: a request handed on again, even after forget()
        counting = cls if cls.__dict__.get(_COUNTING) else _counting_class(cls, self.recorder)
        self._classes[cls] = self._classes[counting] = counting
        return counting

    def wrap(self, on_task_request: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """*on_task_request*, first making the request count its outcome."""
        classes = self._classes

        def counted_task_request(request: Any) -> Any:
            cls = request.__class__
            counting = classes.get(cls)
            if counting is None:
                counting = self._class_for(cls)
            try:
                request.__class__ = counting
            except TypeError:  # a request class whose layout forbids it: not counted
                logger.warning(
                    "celery-extras stats: cannot count requests of class %r", cls, exc_info=True
                )
                classes[cls] = cls
            return on_task_request(request)

        return counted_task_request
