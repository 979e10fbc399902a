"""Signals celery-extras sends, in the style of :mod:`celery.signals`.

They are how one capability tells another what happened without importing it:
the policies capability sends :data:`task_rate_limited`, the stats recorder
counts it.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["task_rate_limited"]

#: Sent in the worker's main process when a task must wait for a token (held in the
#: worker or handed back to the broker with an ETA). ``sender`` is the task name;
#: ``request`` the :class:`celery.worker.request.Request`; ``wait`` the seconds to wait.
task_rate_limited = Signal(name="task_rate_limited", providing_args={"request", "wait"})
