"""How one call of a batch ends, in the worker's main process, then has its message acked.

Its part of the batch's ending (:data:`~.runner.BatchEnding`), or its own (its item an
exception, a :meth:`~celery_extras.Call.retry`): a success or a failure ends it as a task
would have ended (:func:`~celery_extras.admission.covered.end_covered`, ``EncodeError`` for
a result that cannot be encoded); a retry publishes it again as its own message; a lost
pool process gives it back to its queue when the task acks late and rejects on a lost
worker. Only then is its message acked, and the gates before this one told.
"""

from __future__ import annotations

import logging
import traceback
from datetime import datetime
from typing import Any

from celery import Celery, signals, states
from celery.app.task import Context
from celery.exceptions import MaxRetriesExceededError
from kombu.exceptions import EncodeError

from .. import compat
from ..admission.covered import CoveredMessage, Outcome, context_of, end_covered
from ..admission.gate import Ticket
from ..signals import task_covered_ended
from .runner import BatchEnding

__all__ = ["CallEndings", "retries_of"]

logger = logging.getLogger("celery_extras.batch")


def retries_of(request: Any) -> int:
    retries = (getattr(request, "request_dict", None) or {}).get("retries")
    return retries if isinstance(retries, int) and not isinstance(retries, bool) else 0


def _end_encoded(app: Celery, name: str, message: CoveredMessage,
                 outcome: Outcome) -> tuple[str, Outcome]:  # fmt: skip
    """End *message* with *outcome* (:func:`end_covered`); as Celery's tracer does, with
    ``EncodeError`` instead when its result cannot be encoded. Its state and outcome."""
    try:
        return end_covered(app, name, message, outcome), outcome
    except EncodeError as exc:
        if outcome.state != states.SUCCESS:
            raise
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        failed = Outcome(states.FAILURE, exc, text, outcome.by)
        return end_covered(app, name, message, failed), failed


class CallEndings:
    """The endings of a batch's calls, for :class:`~.gate.BatchGate`: its *app*, its
    *counts* and the handle (``_handle``) its gates are told through."""

    app: Celery
    counts: dict[str, int]
    _handle: Any

    def _end_call(self, ticket: Ticket, index: int, ending: BatchEnding, batch_id: str) -> None:
        """End call *index* of batch *batch_id* with its part of *ending*, or its own ending
        (its item an exception or a :meth:`~celery_extras.Call.retry`), then ack it."""
        own = ending[2] if ending[0] == "success" and len(ending) > 2 else None
        if own and index in own:
            ending = own[index]
        kind = ending[0]
        try:
            if kind == "success":
                self._ended(ticket, Outcome(states.SUCCESS, ending[1][index], None, batch_id))
            elif kind == "retry":
                self._retry(ticket, ending[1], ending[2], ending[3], batch_id)
            elif (
                kind == "lost"
                and ticket.request.task.acks_late
                and (ticket.request.task.reject_on_worker_lost)
            ):
                self._give_back(ticket)
            else:
                text = ending[2] if len(ending) > 2 else None
                self._ended(ticket, Outcome(states.FAILURE, ending[1], text, batch_id))
        except Exception:  # a result backend that fails: the message still goes
            logger.exception("celery-extras: ending call %s of batch %s failed",
                             ticket.request.id, batch_id)  # fmt: skip
            self._release(ticket)

    def _ended(self, ticket: Ticket, outcome: Outcome) -> None:
        """End one call with *outcome* (the canvas rule), then ack its message."""
        request = ticket.request
        try:
            message = CoveredMessage(request.id, context_of(request))
            state, outcome = _end_encoded(self.app, ticket.name, message, outcome)
            task_covered_ended.send(sender=ticket.name, task_id=request.id, state=state,
                                    by=outcome.by)  # fmt: skip
            if state == states.SUCCESS:
                self.counts["succeeded"] += 1
                request.send_event("task-succeeded", result=repr(outcome.result), runtime=0.0)
            elif state == states.FAILURE:
                self.counts["failed"] += 1
                request.send_event("task-failed", exception=repr(outcome.result),
                                   traceback=outcome.traceback or "")  # fmt: skip
        finally:
            self._release(ticket, outcome=outcome.result)

    def _retry(self, ticket: Ticket, when: Any, exc: BaseException | None,
               max_retries: int | None, batch_id: str) -> None:  # fmt: skip
        """Retry one call of a batch that retried, as its own message (Celery's
        ``Task.retry`` for it: the same id, one more retry, its callbacks and chord kept)."""
        request = ticket.request
        task = request.task
        retries = retries_of(request)
        limit = task.max_retries if max_retries is None else max_retries
        if limit is not None and retries >= limit:
            error = exc or MaxRetriesExceededError(
                f"Can't retry {task.name}[{request.id}] args:{request.args} kwargs:{request.kwargs}"
            )
            self._ended(ticket, Outcome(states.FAILURE, error, None, batch_id))
            return
        context = Context(
            {**context_of(request), "delivery_info": dict(request.delivery_info or {})}
        )
        timing = {"eta": when} if isinstance(when, datetime) else {"countdown": when}
        task.signature_from_request(context, request.args, request.kwargs,
                                    retries=retries + 1, **timing).apply_async()  # fmt: skip
        task.backend.mark_as_retry(request.id, exc, request=context)
        signals.task_retry.send(sender=task, request=context, reason=exc, einfo=None)
        request.send_event("task-retried", exception=repr(exc), traceback="")
        self.counts["retried"] += 1
        seconds = when if isinstance(when, int | float) else None
        self._release(ticket, retry_in=float(seconds or 0.0))

    def _give_back(self, ticket: Ticket) -> None:
        self.counts["requeued"] += 1
        compat.forget_held(ticket.request)
        ticket.request.reject(requeue=True)
        compat.narrow_prefetch(ticket.consumer)
        self._handle.ended(ticket)

    def _release(self, ticket: Ticket, retry_in: float | None = None, outcome: Any = None) -> None:
        """Ack the call's message (once), narrow the window, tell the gates before this one."""
        compat.forget_held(ticket.request)
        ticket.request.acknowledge()
        compat.narrow_prefetch(ticket.consumer)
        self._handle.ended(ticket, retry_in, outcome)
