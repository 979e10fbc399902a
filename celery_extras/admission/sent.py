"""When a message was sent: a header its producer stamps, for the policies that read it.

A coalescing run covers the messages of its key sent before it started, and a debounced
burst runs with its last message's arguments, the last one sent: so a worker needs each
message's send time, not the order in which a prefetched batch (or two workers) take
them. A producer with celery-extras installed stamps :data:`SENT_HEADER` (wall-clock
seconds) on every message of a task in :data:`stamped_tasks` (each such policy's
decorator adds its tasks: one stamp serves a task with both); a message without one
(``send_task`` from an app without celery-extras, a foreign producer) counts as sent
when it reached the worker. A stamp from the future (a forged header, a skewed clock)
counts as now, and a message with an ETA as sent at its ETA: a run before the ETA does
not do its work. Of Celery, only the publish signal the stamp is connected to.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

from celery.signals import before_task_publish

from ..checks import is_number
from ..clock import wall

__all__ = ["SENT_HEADER", "connect_stamps", "sent_at", "stamp_sent", "stamped_tasks"]

SENT_HEADER = "extras_sent"

#: Names of the tasks whose messages are stamped (filled by the decorators that read it).
stamped_tasks: set[str] = set()


def stamp_sent(
    sender: Any = None,
    headers: MutableMapping[str, Any] | None = None,
    clock: Callable[[], float] = wall,
    **kwargs: Any,
) -> None:
    """``before_task_publish`` receiver: stamp the send time on a message of a task in
    :data:`stamped_tasks` (kept when already there: a message published again keeps its
    first send time)."""
    if headers is None or sender not in stamped_tasks:
        return
    if SENT_HEADER not in headers:
        headers[SENT_HEADER] = round(clock(), 6)


def connect_stamps(app: Any = None) -> None:
    """Stamp the messages every producer of this process publishes (once, whoever asks)."""
    before_task_publish.connect(stamp_sent, weak=False, dispatch_uid="celery_extras.sent")


def sent_at(headers: Any, eta: Any, now: float) -> float:
    """The send time of a message with *headers* and *eta* (an ISO 8601 text or a datetime)
    that reached a worker at *now* (epoch seconds)."""
    stamp = headers.get(SENT_HEADER) if isinstance(headers, dict) else None
    sent = min(float(stamp), now) if is_number(stamp, above=0) else now
    when = _epoch(eta)
    if when is not None:
        sent = max(sent, min(when, now))
    return sent


def _epoch(eta: Any) -> float | None:
    if isinstance(eta, str):
        try:
            eta = datetime.fromisoformat(eta)
        except ValueError:
            return None
    if not isinstance(eta, datetime):
        return None
    if eta.tzinfo is None:
        eta = eta.replace(tzinfo=UTC)
    try:
        return float(eta.timestamp())
    except (OverflowError, OSError, ValueError):
        return None
