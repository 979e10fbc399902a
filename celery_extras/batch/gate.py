"""The batching gate of the admission pipeline: calls gather here and run as one pool job.

The last gate of a task with ``batch()``: each call that passed the task's other gates
(limits, slots, coalescing) waits here, unacked, in its bucket's open batch
(:class:`~.table.BatchTable`; the prefetch window widened by one per call, so a batch
fills to its size whatever ``worker_prefetch_multiplier`` is). A batch that is full, or
whose ``wait`` has passed, runs in the pool as one job (:func:`~.runner.run_batch`). When
it returns, every call ends as if it had run with its own part of the outcome
(:func:`~celery_extras.admission.covered.end_covered`: its result, callbacks, chain and
chord part; the batch's exception for each; a retry of each, as its own message), and only
then is its message acked: a worker killed mid-batch loses none of them. The calls end a
slice at a time, between turns of the worker's loop (:data:`SLICE`), so a huge batch
never freezes the worker.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import Celery, signals, states
from celery.app.task import Context
from celery.exceptions import MaxRetriesExceededError
from kombu.exceptions import EncodeError

from .. import compat
from ..admission.covered import CoveredMessage, Outcome, context_of, end_covered
from ..admission.gate import QUEUED, Answer, Gate, Ticket
from ..admission.serial import serial
from ..admission.spec import call_key
from ..clock import monotonic
from ..signals import task_batched, task_covered_ended
from .runner import BatchEnding, read_ending, run_batch
from .spec import BatchSpec
from .table import Batch, BatchTable

__all__ = ["NEXT_SLICE", "SLICE", "SLICE_SECONDS", "BatchGate"]

logger = logging.getLogger("celery_extras.batch")

#: A batch's calls end in slices, one per turn of the worker's loop, each of at most SLICE
#: calls or SLICE_SECONDS (real time, ~1 ms a call: its result, callbacks, event and ack),
#: so a batch of 10,000 never keeps the loop from pings, heartbeats and other messages.
SLICE = 500
SLICE_SECONDS = 0.05
#: Seconds before the next slice: the loop polls first (an entry due now would run in the
#: same turn of its timer).
NEXT_SLICE = 0.001


def _retries(request: Any) -> int:
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


def _call(request: Any) -> dict[str, Any]:
    headers = getattr(getattr(request, "message", None), "headers", None) or {}
    return {"id": request.id, "args": list(request.args or ()),
            "kwargs": dict(request.kwargs or {}), "headers": dict(headers)}  # fmt: skip


class BatchGate(Gate):
    """The open and running batches of one worker's consumer."""

    label = "batch"

    def __init__(self, app: Celery, settings: Mapping[str, Any],
                 clock: Callable[[], float] = monotonic) -> None:  # fmt: skip
        self.app = app
        self.clock = clock
        self.specs: dict[str, BatchSpec] = {}
        self.table: BatchTable[Ticket] = BatchTable(clock)
        self.running: dict[str, list[Ticket]] = {}  # by batch id, until each call ended
        self._ending: set[str] = set()  # batches whose calls are ending, slice by slice
        self.counts = {"batches": 0, "calls": 0, "succeeded": 0, "failed": 0, "retried": 0,
                       "revoked": 0, "requeued": 0}  # fmt: skip
        self._pipeline: Any = None
        self._consumer: Any = None
        self._main = threading.main_thread()

    def handles(self, name: str) -> bool:
        return name in self.specs

    def register(self, name: str, policies: Any) -> None:
        spec = getattr(policies, "batch", None)
        if spec is not None:
            self.specs[name] = spec

    def start(self, pipeline: Any, consumer: Any) -> None:
        self._pipeline, self._consumer = pipeline, consumer

    # -- gathering -----------------------------------------------------------------------------

    def admit(self, ticket: Ticket) -> Answer:
        spec = self.specs[ticket.name]
        key = call_key(ticket.name, spec.key, ticket.request, "batch", "batch", logger)
        full = self.table.add((ticket.name, key), ticket, spec.size, spec.wait)
        if full is not None:  # run it once the pipeline has counted this call as queued
            serial(ticket.consumer).call_after(0.0, self._run, (full,))
        return QUEUED

    def tick(self) -> None:
        self.flush_due()

    def flush_due(self) -> int:
        """Run the batches whose wait has passed; how many."""
        due = self.table.take_due()
        for batch in due:
            self._run(batch)
        return len(due)

    def queued(self) -> int:
        return self.table.waiting() + sum(len(t) for t in self.running.values())

    def stop(self) -> None:
        """Connection lost or shutting down: open batches are dropped (the broker delivers
        their messages again); running ones end as they end."""
        for batch in self.table.take_all():
            for ticket in batch.items:
                compat.forget_held(ticket.request)

    # -- running -------------------------------------------------------------------------------

    def _run(self, batch: Batch[Ticket]) -> None:
        name = batch.bucket[0]  # type: ignore[index]
        tickets = [t for t in batch.items if not self._revoked(t)]
        if not tickets:
            return
        task = self.app.tasks[name]
        batch_id = f"batch-{uuid.uuid4().hex}"
        first = tickets[0].request
        request = {
            "id": batch_id,
            "task": name,
            "retries": max(_retries(t.request) for t in tickets),
            "hostname": getattr(first, "hostname", None),
            "delivery_info": dict(first.delivery_info or {}),
        }
        self.running[batch_id] = tickets
        self.counts["batches"] += 1
        self.counts["calls"] += len(tickets)
        task_batched.send(sender=name, size=len(tickets), batch_id=batch_id)
        calls = [_call(t.request) for t in tickets]
        # once the pipeline's lock is let go: a green pool's spawn waits for a free slot
        serial(self._consumer).after(self._apply, task, batch_id, calls, request)

    def _apply(self, task: Any, batch_id: str, calls: list[Any], request: Any) -> None:
        """Hand batch *batch_id* to the pool (outside the pipeline's lock)."""
        try:
            self._consumer.pool.apply_async(
                run_batch,
                args=(task.name, calls, request),
                callback=functools.partial(self._returned, batch_id),
                error_callback=functools.partial(self._lost, batch_id),
                soft_timeout=task.soft_time_limit,
                timeout=task.time_limit,
                correlation_id=batch_id,
            )
        except Exception as exc:  # the pool refused the job: every call goes back
            logger.error(
                "celery-extras: the pool refused batch %s of %s (%r); its %d messages go "
                "back to the queue", batch_id, task.name, exc, len(calls),
            )  # fmt: skip
            with serial(self._consumer):
                for ticket in self.running.pop(batch_id, []):
                    self._give_back(ticket)

    def _revoked(self, ticket: Ticket) -> bool:
        """A call revoked while it waited for its batch ends revoked, not in the batch."""
        request = ticket.request
        if request.id not in compat.worker_revoked():
            return False
        self.counts["revoked"] += 1
        self._ended(ticket, Outcome(states.REVOKED, "revoked", None, request.id))
        return True

    def _returned(self, batch_id: str, ending: Any) -> None:
        """The pool's callback (in a pool thread with ``-P threads``: on to the loop)."""
        if threading.current_thread() is not self._main:
            serial(self._consumer).call_after(0.0, self._end, (batch_id, ending))
            return
        serial(self._consumer).run(self._end, batch_id, ending)

    def _lost(self, batch_id: str, exc_info: Any) -> None:
        """The pool's error callback: as Celery does for a task, the calls go back when its
        process died (``WorkerLostError``) and the task acks late and rejects on a lost
        worker; else (a hard time limit, a result the pool could not send back: never a
        lost worker) each fails with the error."""
        exc, text = getattr(exc_info, "exception", exc_info), getattr(exc_info, "traceback", None)
        exc = exc if isinstance(exc, BaseException) else RuntimeError(repr(exc))
        kind = "lost" if isinstance(exc, WorkerLostError) else "error"
        self._returned(batch_id, (kind, exc, text if isinstance(text, str) else None))

    def _end(self, batch_id: str, ending: BatchEnding) -> None:
        """End the calls of batch *batch_id* as it ended (*ending*): a slice of them now,
        the rest in slices between later turns of the loop (:data:`SLICE`)."""
        if batch_id not in self.running or batch_id in self._ending:
            return
        self._ending.add(batch_id)
        self._end_slice(batch_id, read_ending(self.app, ending), 0)

    def _end_slice(self, batch_id: str, ending: BatchEnding, done: int) -> None:
        """End the next calls of batch *batch_id* (the *done* first have ended): at most
        :data:`SLICE` of them or :data:`SLICE_SECONDS` of the loop's time, the rest after
        the loop's next turn."""
        tickets = self.running.get(batch_id, [])
        started = time.perf_counter()
        count = 0
        while count < min(len(tickets), SLICE) and (
            count == 0 or time.perf_counter() - started < SLICE_SECONDS
        ):
            self._end_call(tickets[count], done + count, ending, batch_id)
            count += 1
        del tickets[:count]
        if tickets:  # after a poll of the loop: a 0 s entry would run in this same turn
            serial(self._consumer).call_after(NEXT_SLICE, self._end_slice,
                                              (batch_id, ending, done + count))  # fmt: skip
            return
        self.running.pop(batch_id, None)
        self._ending.discard(batch_id)

    def _end_call(self, ticket: Ticket, index: int, ending: BatchEnding, batch_id: str) -> None:
        """End call *index* of batch *batch_id* with its part of *ending* (then ack it)."""
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
        retries = _retries(request)
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
        self._pipeline.ended(ticket)

    def _release(self, ticket: Ticket, retry_in: float | None = None, outcome: Any = None) -> None:
        """Ack the call's message (once), narrow the window, tell the gates before this one."""
        compat.forget_held(ticket.request)
        ticket.request.acknowledge()
        compat.narrow_prefetch(ticket.consumer)
        self._pipeline.ended(ticket, retry_in, outcome)

    def info(self) -> dict[str, Any]:
        tasks = {name: {**spec.describe(), "waiting": 0, "running": 0}
                 for name, spec in self.specs.items()}  # fmt: skip
        for batch in self.table.open.values():
            tasks[batch.bucket[0]]["waiting"] += len(batch.items)  # type: ignore[index]
        for tickets in self.running.values():
            tasks[tickets[0].name]["running"] += len(tickets)
        return {"tasks": tasks, **self.counts}
