"""Celery's worker state as the unit tests see it: Celery 5.7 lists a request held in the
timer among its scheduled requests (``compat.track_held``); 5.5 and 5.6 track it nowhere."""

from __future__ import annotations

from celery.worker import state

__all__ = ["TRACKS_HELD", "clear"]

#: Whether this Celery knows the requests held in the worker's timer (5.7+).
TRACKS_HELD = hasattr(state, "task_scheduled")


def clear() -> None:
    """Forget every request of the worker state, as a fresh worker has none."""
    state.requests.clear()
    state.reserved_requests.clear()
    scheduled = getattr(state, "scheduled_requests", None)
    if scheduled is not None:
        scheduled.clear()
