"""Guards against known bugs of the Celery and kombu versions celery-extras supports.

Each guard names the bug it works around, acts as narrowly as it can, and logs
when it acts.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker.consumer.connection import Connection

__all__ = ["RedisCloseGuard"]

logger = logging.getLogger(__name__)


class RedisCloseGuard(bootsteps.StartStopStep):
    """Keeps a Redis restart from killing the worker.

    When the broker connection is lost, Celery 5.7 closes the old connection and
    ignores only connection errors. kombu 5.7's Redis channel, closed while it
    holds unacked messages to restore, asks the already-dropped connection for
    its ``hostname`` and raises :class:`AttributeError`, which ends the worker
    ("Unrecoverable error"): here plain Celery lost its worker in one Redis
    restart out of four. This step makes that close log a warning instead; the
    unacked messages are restored after the visibility timeout, as usual.
    """

    label = "extras-redis-close-guard"
    requires = (Connection,)

    def start(self, c: Any) -> None:
        connection = c.connection
        if connection is None or connection.transport.driver_type != "redis":
            return
        release = connection.release

        def guarded_release() -> None:
            try:
                release()
            except AttributeError as exc:
                logger.warning(
                    "celery-extras: closing the lost Redis connection failed in kombu (%r); "
                    "its unacked messages return after the visibility timeout",
                    exc,
                )

        connection.release = connection.close = guarded_release
