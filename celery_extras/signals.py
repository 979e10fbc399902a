"""Signals celery-extras sends, in the style of :mod:`celery.signals`.

They are how one capability tells another what happened without importing it:
the policies capability sends :data:`task_rate_limited`, the stats recorder
counts it.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "task_batched",
    "task_coalesced",
    "task_concurrency_limited",
    "task_covered_ended",
    "task_debounced",
    "task_memoized",
    "task_parked",
    "task_rate_limited",
    "task_released",
    "task_shadow_limited",
]

#: Sent in the worker's main process when a task must wait for a token (held in the
#: worker or parked in the delay store). ``sender`` is the task name;
#: ``request`` the :class:`celery.worker.request.Request`; ``wait`` the seconds to wait;
#: ``limit`` the limit that holds it (its rate, and its place when the task has several).
task_rate_limited = Signal(name="task_rate_limited", providing_args={"request", "wait", "limit"})

#: Sent in the worker's main process when a shadow limit (``limit(..., shadow=True)``)
#: would have held a task that runs anyway. ``sender`` is the task name; ``request`` the
#: request; ``wait`` the seconds it would have waited; ``limit`` as above.
task_shadow_limited = Signal(
    name="task_shadow_limited", providing_args={"request", "wait", "limit"}
)

#: Sent in the worker's main process when a task is parked in the delay store (its wait
#: outlasts the prefetch window). ``sender`` is the task name; ``request`` the request
#: (``None`` for a retry parked from the pool, which sends it in that pool process, and for
#: an ETA task parked on arrival); ``due`` the seconds until it is due.
task_parked = Signal(name="task_parked", providing_args={"request", "due"})

#: Sent in the worker's main process when a mover publishes a parked task back to its
#: queue. ``sender`` is the task name; ``task_id`` its id.
task_released = Signal(name="task_released", providing_args={"task_id"})

#: Sent in the worker's main process when a task must wait for a concurrency slot.
#: ``sender`` is the task name; ``request`` the request.
task_concurrency_limited = Signal(name="task_concurrency_limited", providing_args={"request"})

#: Sent in the worker's main process when a message of a coalesced task is covered by a
#: run of its key (acked; it never runs). ``sender`` is the task name; ``request`` the
#: request; ``by`` the id of the covering run.
task_coalesced = Signal(name="task_coalesced", providing_args={"request", "by"})

#: Sent in the worker's main process when a message a policy covered (coalesced,
#: debounced...) has ended with the outcome of the run that covered it (see
#: :mod:`celery_extras.admission.covered`); the worker is the one that ends it, maybe not the
#: one that received it. ``sender`` is the task name; ``task_id`` the covered message's id;
#: ``state`` ``SUCCESS``, ``FAILURE`` or ``REVOKED``; ``by`` the id of the covering run.
task_covered_ended = Signal(name="task_covered_ended", providing_args={"task_id", "state", "by"})

#: Sent in the worker's main process when a batch of a ``batch()`` task goes to the pool as
#: one job. ``sender`` is the task name; ``size`` its number of calls; ``batch_id`` its id.
task_batched = Signal(name="task_batched", providing_args={"size", "batch_id"})

#: Sent in the worker's main process when a message of a debounced task is covered by a
#: later message of its key (acked; it never runs: the run of the burst does its work).
#: ``sender`` is the task name; ``request`` the request; ``by`` the id of the covering run.
task_debounced = Signal(name="task_debounced", providing_args={"request", "by"})

#: Sent in the worker's main process when a message of a memoized task is covered: by the
#: kept result of its key's last run (it ends with that result), or by its key's run in
#: flight (it joins it). ``sender`` is the task name; ``request`` the request; ``by`` the
#: id of the covering run.
task_memoized = Signal(name="task_memoized", providing_args={"request", "by"})
