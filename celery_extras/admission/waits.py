"""The one place a wait becomes a timer entry in the worker (or a parked delay-store entry).

A message held here stays unacked and takes no pool slot; the prefetch window is
widened while it waits (as Celery does for ETA tasks), so the messages behind it
keep flowing. A connection lost drops every hold: the broker delivers the messages
again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from .. import compat
from ..delay.parking import Park

__all__ = ["TimerHolds", "park_message"]


class TimerHolds:
    """Messages (or requests) held in a consumer's timer, each under a key."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[Any, Any]] = {}  # key -> (timer entry, request)

    def __len__(self) -> int:
        return len(self._entries)

    def hold(
        self,
        consumer: Any,
        key: Hashable,
        seconds: float,
        due: Callable[..., None],
        args: tuple[Any, ...] = (),
        request: Any = None,
    ) -> None:
        """Call ``due(*args)`` in *seconds* from the consumer's event loop, unless dropped."""
        compat.widen_prefetch(consumer)
        entry = consumer.timer.call_after(seconds, due, args, priority=6)
        self._entries[key] = (entry, request)
        if request is not None:
            compat.track_held(request, entry)  # so Celery's on_close() cancels it too (5.7+)

    def release(self, consumer: Any, key: Hashable) -> bool:
        """The hold of *key* ended: ``True`` (prefetch narrowed) unless it was dropped."""
        if self._entries.pop(key, None) is None:
            return False
        compat.narrow_prefetch(consumer)
        return True

    def drop_all(self) -> None:
        """Cancel every hold; a held request is dropped from Celery's state too."""
        for entry, request in self._entries.values():
            entry.cancel()
            if request is not None:
                compat.forget_held(request)
        self._entries.clear()


def park_message(arrival: Any, request: Any, name: str, kind: str, delay: float
                 ) -> tuple[Park, str]:  # fmt: skip
    """Park *request*'s message in the delay store for *delay* s, then ack it: how it went
    and its entry's id. Unless :attr:`~Park.PARKED` nothing is acked: the caller holds it
    (:attr:`~Park.IN_DOUBT`: and parks it again before it may run it)."""
    message = request.message
    headers = message.headers or {}
    if "task" not in headers or "id" not in headers:
        return Park.KEPT, ""  # protocol 1 message: hold it instead
    parker = arrival.parker
    eid, entry = parker.entry_of_message(message, name, kind)
    parked = parker.park(eid, entry, delay, request)
    if parked:
        request.acknowledge()
    return parked, str(eid)
