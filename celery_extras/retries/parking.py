"""Parking a retry: Celery's own ``task.retry`` with a producer that parks, not publishes.

The retry message is built by Celery as usual (same id, ``retries + 1``, its ETA,
links, headers); :class:`ParkingProducer` receives the ``publish`` call, turns it
into an :class:`~.entry.Entry` and parks it until its ETA. When the store cannot
take it, the retry is published as Celery would (with its ETA), so it is never
lost. A park whose reply was lost (in doubt: the store may hold it) is parked again until
the store answers, for up to :data:`SETTLE_PATIENCE` s, before the retry is published
instead: published beside a stored copy, the retry would run twice. Runs in the pool
process that ran the task.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.serialization import dumps

from ..clock import monotonic
from ..delay.parking import Park, Parker

__all__ = ["SETTLE_PATIENCE", "ParkingProducer"]

logger = logging.getLogger(__name__)

#: Seconds a retry whose park is in doubt waits for the store to answer a park again.
SETTLE_PATIENCE = 10.0


class ParkingProducer:
    """Stands in for *producer* in ``send_task``: ``publish`` parks the message for *delay* s."""

    def __init__(self, producer: Any, parker: Parker, task: str, delay: float) -> None:
        self._producer = producer
        self._parker = parker
        self._task = task
        self._delay = delay
        self._start = monotonic()
        self.parked = False

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._producer, attr)

    def publish(self, body: Any, **kwargs: Any) -> Any:
        if kwargs.get("compression"):
            return self._producer.publish(body, **kwargs)
        content_type, content_encoding, data = dumps(body, serializer=kwargs.get("serializer"))
        eid, entry = self._parker.entry(
            task=self._task,
            kind="retry",
            body=data,
            headers=kwargs.get("headers") or {},
            properties=kwargs,
            content_type=content_type,
            content_encoding=content_encoding,
            exchange=str(kwargs.get("exchange") or ""),
            routing_key=str(kwargs.get("routing_key") or ""),
        )
        delay = max(0.0, self._delay - (monotonic() - self._start))
        parked = self._parker.park(eid, entry, delay)
        if parked is Park.IN_DOUBT:
            parked = self._parker.settle(eid, entry, delay, SETTLE_PATIENCE)
            if parked is Park.IN_DOUBT:
                logger.warning(
                    "celery-extras: the store never answered whether it parked the retry of "
                    "%s[%s] within %.0f s: it is published too, and may run twice",
                    self._task, entry.task_id, SETTLE_PATIENCE,
                )  # fmt: skip
        if parked:
            self.parked = True
            return None
        return self._producer.publish(body, **kwargs)  # the store is away: Celery's ETA
