"""The batching gate of the admission pipeline: calls gather here and run as one pool job.

The last gate of a task with ``batch()``: each call that passed the task's other gates
(limits, slots, coalescing) waits here, unacked, in its bucket's open batch
(:class:`~.table.BatchTable`; the prefetch window widened by one per call, so a batch
fills to its size whatever ``worker_prefetch_multiplier`` is). A batch that is full, or
whose ``wait`` has passed, runs in the pool as one job (:func:`~.runner.run_batch`; its
calls made a slice at a time). When it returns, every call ends as if it had run with its
own part of the outcome (:func:`~celery_extras.admission.covered.end_covered`: its result,
callbacks, chain and chord part; the batch's exception for each, or the call's own item: an
exception, a :meth:`~celery_extras.Call.retry`; a retry of each, as its own message), and
only then is its message acked: a worker killed mid-batch loses none of them. The calls end a
slice at a time, between turns of the worker's loop (:data:`SLICE`), so a huge batch
never freezes the worker.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import Celery, states

from .. import compat
from ..admission.covered import Outcome
from ..admission.gate import QUEUED, Answer, Gate, Ticket
from ..admission.handle import GateHandle
from ..admission.serial import serial
from ..admission.spec import call_key
from ..clock import monotonic
from ..signals import task_batched
from .endings import CallEndings, retries_of
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


#: Fields of a worker request's ``request_dict`` that are no header of its message: the
#: worker's additions, and under protocol 1 the body's arguments and canvas.
_NOT_HEADERS = frozenset({
    "args", "kwargs", "properties", "delivery_info", "hostname", "reply_to",
    "correlation_id", "callbacks", "errbacks", "chord", "chain", "headers", "utc", "taskset",
})  # fmt: skip


def _text(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _call(request: Any) -> dict[str, Any]:
    """The fields of the :class:`~celery_extras.Call` of worker request *request*: its
    headers read from its ``request_dict`` (the message's headers under protocol 2, its body
    under protocol 1, where the message's own headers are a field of it)."""
    fields = getattr(request, "request_dict", None) or {}
    headers = {k: v for k, v in fields.items() if k not in _NOT_HEADERS}
    if isinstance(fields.get("headers"), Mapping):  # protocol 1
        headers.update(fields["headers"])
    return {
        "id": request.id, "args": list(request.args or ()), "kwargs": dict(request.kwargs or {}),
        "headers": headers, "name": request.name,
        "delivery_info": dict(request.delivery_info or {}), "hostname": request.hostname,
        "reply_to": fields.get("reply_to"), "correlation_id": fields.get("correlation_id"),
        "retries": retries_of(request), "eta": _text(fields.get("eta")),
        "expires": _text(fields.get("expires")),
        "ignore_result": bool(getattr(request, "ignore_result", False)),
    }  # fmt: skip


class BatchGate(CallEndings, Gate):
    """The open and running batches of one worker's consumer."""

    label = "batch"

    def __init__(self, app: Celery, settings: Mapping[str, Any],
                 clock: Callable[[], float] = monotonic) -> None:  # fmt: skip
        self.app = app
        self.clock = clock
        self.specs: dict[str, BatchSpec] = {}
        self.table: BatchTable[Ticket] = BatchTable(clock)
        self.running: dict[str, list[Ticket]] = {}  # by batch id, until each call ended
        self._due: list[Batch[Ticket]] = []  # full batches taken, to run in a timer entry
        self._packing: set[str] = set()  # batches running here, not yet in the pool
        self._returned_endings: dict[str, Any] = {}  # batches back from the pool, to end
        #: batches whose calls are ending, slice by slice: their ending and calls ended
        self._ending: dict[str, tuple[BatchEnding, int]] = {}
        self._stopped = False
        self.counts = {"batches": 0, "calls": 0, "succeeded": 0, "failed": 0, "retried": 0,
                       "revoked": 0, "requeued": 0}  # fmt: skip
        self._handle: Any = None
        self._consumer: Any = None
        self._main = threading.main_thread()

    def handles(self, name: str) -> bool:
        return name in self.specs

    def register(self, name: str, policies: Any) -> None:
        spec = getattr(policies, "batch", None)
        if spec is not None:
            self.specs[name] = spec

    def start(self, handle: GateHandle, consumer: Any) -> None:
        self._handle, self._consumer = handle, consumer
        self._stopped = False

    # -- gathering -----------------------------------------------------------------------------

    def admit(self, ticket: Ticket) -> Answer:
        spec = self.specs[ticket.name]
        key = call_key(ticket.name, spec.key, ticket.request, "batch", "batch", logger)
        full = self.table.add((ticket.name, key), ticket, spec.size, spec.wait)
        if full is not None:  # run it once the pipeline has counted this call as queued
            self._due.append(full)
            serial(ticket.consumer).call_after(0.0, self._run_due, (full,))
        return QUEUED

    def tick(self) -> None:
        self.run_due()

    def next_due(self) -> float | None:
        """When the first open batch's wait ends (simulated time moves there), or ``None``."""
        return self.table.next_due()

    def run_due(self) -> None:
        """Run the batches whose wait has passed."""
        for batch in self.table.take_due():
            self._run(batch)

    def busy(self) -> str:
        running = sum(map(len, self.running.values()))
        return f"{running} batched call(s) running" if running else ""

    def queued(self) -> int:
        return self.table.waiting() + sum(len(t) for t in self.running.values())

    def stop(self) -> None:
        """Connection lost or shutting down: open batches, and batches not yet in the pool,
        are dropped (their messages stay unacked: the broker delivers them again); batches
        back from the pool end now, while their messages can still be acked (no later turn
        of the loop, whose timer stops with the pool: chaos seed 792644); running ones end
        as they return (:meth:`_returned`)."""
        self._stopped = True
        dropped = [batch.items for batch in self.table.take_all() + self._due]
        self._due = []
        dropped += [self.running.pop(batch_id, []) for batch_id in self._packing]
        self._packing.clear()
        for tickets in dropped:
            for ticket in tickets:
                compat.forget_held(ticket.request)
        for batch_id, ending in list(self._returned_endings.items()):
            self._end(batch_id, ending)
        for batch_id, (read, done) in list(self._ending.items()):
            self._end_slice(batch_id, read, done)

    def _stopping(self) -> bool:
        """The consumer stopped, or a warm stop began (Celery's loop still takes messages
        for one more turn): a batch not yet in the pool does not start any more."""
        return self._stopped or compat.worker_stopping()

    # -- running -------------------------------------------------------------------------------

    def _run_due(self, batch: Batch[Ticket]) -> None:
        """Run full batch *batch*, unless :meth:`stop` dropped it meanwhile."""
        if any(due is batch for due in self._due):
            self._due = [due for due in self._due if due is not batch]
            self._run(batch)

    def _run(self, batch: Batch[Ticket]) -> None:
        name = batch.bucket[0]  # type: ignore[index]
        if self._stopping():  # its calls go back to the broker, unrun and unacked
            for ticket in batch.items:
                compat.forget_held(ticket.request)
            return
        tickets = [t for t in batch.items if not self._revoked(t)]
        if not tickets:
            return
        task = self.app.tasks[name]
        batch_id = f"batch-{uuid.uuid4().hex}"
        first = tickets[0].request
        request = {
            "id": batch_id,
            "task": name,
            "retries": max(retries_of(t.request) for t in tickets),
            "hostname": getattr(first, "hostname", None),
            "delivery_info": dict(first.delivery_info or {}),
        }
        self.running[batch_id] = tickets
        self._packing.add(batch_id)
        self.counts["batches"] += 1
        self.counts["calls"] += len(tickets)
        task_batched.send(sender=name, size=len(tickets), batch_id=batch_id)
        self._pack(task, batch_id, request, [])

    def _pack(self, task: Any, batch_id: str, request: Any, calls: list[Any]) -> None:
        """Make the next calls of batch *batch_id* (:func:`_call`; *calls* made so far), at
        most :data:`SLICE` of them or :data:`SLICE_SECONDS` of the loop's time, the rest
        after the loop's next turn, as its calls end; then hand it to the pool."""
        if batch_id not in self._packing:
            return  # dropped by stop()
        tickets = self.running[batch_id]
        started = time.perf_counter()
        end = min(len(tickets), len(calls) + SLICE)
        while len(calls) < end and (time.perf_counter() - started < SLICE_SECONDS):
            calls.append(_call(tickets[len(calls)].request))
        if len(calls) < len(tickets):
            serial(self._consumer).call_after(NEXT_SLICE, self._pack,
                                              (task, batch_id, request, calls))  # fmt: skip
            return
        # once the pipeline's lock is let go: a green pool's spawn waits for a free slot
        serial(self._consumer).after(self._apply, task, batch_id, calls, request)

    def _apply(self, task: Any, batch_id: str, calls: list[Any], request: Any) -> None:
        """Hand batch *batch_id* to the pool (outside the pipeline's lock), unless a stop
        began: then its calls go back to the broker, unrun and unacked."""
        with serial(self._consumer):
            if batch_id not in self._packing:
                return  # dropped by stop()
            self._packing.discard(batch_id)
            if self._stopping():
                for ticket in self.running.pop(batch_id, []):
                    compat.forget_held(ticket.request)
                return
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
        """The pool's callback (in a pool thread or greenlet with ``-P threads``, gevent or
        eventlet: on to the loop; in place once a stop began, as the loop turns no more and
        its timer stops with the pool: the calls that ran are acked before the connection
        closes, chaos seed 792644)."""
        on_loop = threading.current_thread() is self._main
        with serial(self._consumer):
            self._returned_endings[batch_id] = ending
            if on_loop or self._stopping():
                self._end(batch_id, ending)
                return
        serial(self._consumer).call_after(0.0, self._end, (batch_id, ending))

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
        self._returned_endings.pop(batch_id, None)
        if batch_id not in self.running or batch_id in self._ending:
            return
        read = read_ending(self.app, ending)
        self._ending[batch_id] = (read, 0)
        self._end_slice(batch_id, read, 0)

    def _end_slice(self, batch_id: str, ending: BatchEnding, done: int) -> None:
        """End the next calls of batch *batch_id* (the *done* first have ended): at most
        :data:`SLICE` of them or :data:`SLICE_SECONDS` of the loop's time, the rest after
        the loop's next turn; all of them once a stop began (no later turn)."""
        if self._ending.get(batch_id, (None, -1))[1] != done:
            return  # ended meanwhile by stop()
        tickets = self.running.get(batch_id, [])
        started = time.perf_counter()
        count, stopping = 0, self._stopping()
        while count < (len(tickets) if stopping else min(len(tickets), SLICE)) and (
            count == 0 or stopping or time.perf_counter() - started < SLICE_SECONDS
        ):
            self._end_call(tickets[count], done + count, ending, batch_id)
            count += 1
        del tickets[:count]
        self._ending[batch_id] = (ending, done + count)
        if tickets:  # after a poll of the loop: a 0 s entry would run in this same turn
            serial(self._consumer).call_after(NEXT_SLICE, self._end_slice,
                                              (batch_id, ending, done + count))  # fmt: skip
            return
        self.running.pop(batch_id, None)
        self._ending.pop(batch_id, None)

    def info(self) -> dict[str, Any]:
        tasks = {name: {**spec.describe(), "waiting": 0, "running": 0}
                 for name, spec in self.specs.items()}  # fmt: skip
        for batch in self.table.open.values():
            tasks[batch.bucket[0]]["waiting"] += len(batch.items)  # type: ignore[index]
        for tickets in self.running.values():
            tasks[tickets[0].name]["running"] += len(tickets)
        return {"tasks": tasks, **self.counts}
