"""When a message was sent, as coalescing reads it: a header its producer stamps.

A run covers the messages of its key sent before it started, so a worker needs each
message's send time, not the order in which a prefetched batch reaches it. A producer
with celery-extras installed stamps :data:`SENT_HEADER` (wall-clock seconds) on every
message of a coalesced task; a message without one (``send_task`` from an app without
celery-extras, a foreign producer) counts as sent when it reached the worker. A stamp
from the future (a forged header, a skewed clock) counts as now, and a message with an
ETA as sent at its ETA: a run before the ETA does not do its work. No Celery import.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

from ..checks import is_number
from ..clock import wall

__all__ = ["SENT_HEADER", "coalesced_tasks", "sent_at", "stamp_sent"]

SENT_HEADER = "extras_sent"

#: Names of the tasks with ``coalesce()`` (filled by the decorator): their messages are stamped.
coalesced_tasks: set[str] = set()


def stamp_sent(
    sender: Any = None,
    headers: MutableMapping[str, Any] | None = None,
    clock: Callable[[], float] = wall,
    **kwargs: Any,
) -> None:
    """``before_task_publish`` receiver: stamp the send time on a coalesced task's message
    (kept when already there: a message published again keeps its first send time)."""
    if headers is None or sender not in coalesced_tasks:
        return
    if SENT_HEADER not in headers:
        headers[SENT_HEADER] = round(clock(), 6)


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
