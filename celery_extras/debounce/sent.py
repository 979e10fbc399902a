"""When a debounced message was sent: the producer's stamp, as coalescing reads it.

"The last message" of a burst is the last one sent, not the last to reach a worker (two
workers may take a burst's messages out of order). A producer with celery-extras installed
stamps the send time on every message of a debounced task it knows (the header and the
reading are coalescing's, :mod:`celery_extras.coalesce.sent`: one stamp serves a task with
both policies); a message without one counts as sent when it reached a worker. No Celery
import.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from ..clock import wall
from ..coalesce.sent import SENT_HEADER, sent_at

__all__ = ["debounced_tasks", "sent_at", "stamp_sent"]

#: Names of the tasks with ``debounce()`` (filled by the decorator): their messages are stamped.
debounced_tasks: set[str] = set()


def stamp_sent(
    sender: Any = None,
    headers: MutableMapping[str, Any] | None = None,
    clock: Callable[[], float] = wall,
    **kwargs: Any,
) -> None:
    """``before_task_publish`` receiver: stamp the send time on a debounced task's message
    (kept when already there: a message published again keeps its first send time)."""
    if headers is None or sender not in debounced_tasks:
        return
    if SENT_HEADER not in headers:
        headers[SENT_HEADER] = round(clock(), 6)
