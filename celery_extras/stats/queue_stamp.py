"""The publish-time stamp a queue's oldest message is aged by.

``install(app)`` connects :func:`stamp_published` to ``before_task_publish``: every task
message a producer with celery-extras publishes carries :data:`PUBLISHED_HEADER`, the
wall-clock seconds of this publish (set again when a message is published again: a retry
is a new wait in its queue). On Redis the queue figures read it from the message at the
head of each queue (:mod:`.queue_reader`); a message without it (a foreign producer) has
no age. Of Celery, only the publish signal.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from celery.signals import before_task_publish

from ..clock import wall

__all__ = ["PUBLISHED_HEADER", "connect_stamp", "stamp_published"]

PUBLISHED_HEADER = "extras_published"


def stamp_published(
    headers: MutableMapping[str, Any] | None = None,
    clock: Callable[[], float] = wall,
    **kwargs: Any,
) -> None:
    """``before_task_publish`` receiver: stamp this publish's time on the message."""
    if headers is not None:
        headers[PUBLISHED_HEADER] = round(clock(), 3)


def connect_stamp(app: Any = None) -> None:
    """Stamp every message this process publishes (once, whichever app asks)."""
    before_task_publish.connect(
        stamp_published, weak=False, dispatch_uid="celery_extras.stats.published"
    )
