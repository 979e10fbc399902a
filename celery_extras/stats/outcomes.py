"""A worker's tasks counted where its main process handles them: arrivals and outcomes.

Two seams, both on the worker's consumer, neither touching a task:

* :func:`counting_strategy` wraps a task's strategy (an entry of the consumer's
  ``strategies``) to count ``received`` as each message reaches it, where Celery
  logs "Task ... received".
* :class:`OutcomeCounter` listens to the consumer's request hook
  (:mod:`celery_extras.admission.request_hook`), which every request passes on its
  way to the pool: it counts ``started``, ``succeeded`` with the runtime, ``failed``,
  ``retried``, ``ignored`` and ``rejected``, each as what Celery does with the
  message.
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

__all__ = ["REPUBLISHED_HEADERS", "OutcomeCounter", "counting_strategy"]

#: Headers celery-extras puts on a message it publishes again itself (a parked task
#: released by the delay store; ``extras_slot`` marked the former hand-back of a limited
#: task): such a message is the same task delivered before, not received again.
REPUBLISHED_HEADERS = ("extras_slot", "extras_parked")

logger = logging.getLogger(__name__)

Strategy = Callable[..., Any]


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


class OutcomeCounter:
    """Counts each request's outcome into *recorder*, as the request hook tells it
    (:class:`~celery_extras.admission.request_hook.RequestHook`)."""

    def __init__(self, recorder: Recorder) -> None:
        count, record_success = recorder.count, recorder.succeeded

        # closures, not methods: the hook calls them on every request
        def started(request: Any) -> None:
            count(request.name, STARTED)

        def succeeded(request: Any, failed__retval__runtime: Any) -> None:
            # a failure goes on to on_failure, which counts it
            try:
                failed, _, runtime = failed__retval__runtime
                if not failed:
                    if isinstance(runtime, (int, float)):
                        record_success(request.name, runtime)
                    else:
                        count(request.name, SUCCEEDED)
            except Exception:  # never let counting break Celery's own handling
                logger.exception("celery-extras stats: could not count the outcome of %s",
                                 request.name)  # fmt: skip

        def failed(request: Any, exc_info: Any) -> None:
            try:
                counter = _failure_counter(request, _exception(exc_info))
                if counter is not None:
                    count(request.name, counter)
            except Exception:
                logger.exception("celery-extras stats: could not count the failure of %s",
                                 request.name)  # fmt: skip

        self.started: Callable[[Any], None] = started
        self.succeeded: Callable[[Any, Any], None] = succeeded
        self.failed: Callable[[Any, Any], None] = failed
