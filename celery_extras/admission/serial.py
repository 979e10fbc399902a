"""One lock around a consumer's admission path, so its gates see one thing at a time.

On the prefork and solo pools everything the pipeline does runs in the worker's event
loop. Elsewhere it does not: on ``-P threads`` a request's end is heard in the pool's
thread, and on ``-P gevent`` / ``-P eventlet`` every timer entry runs in a greenlet of its
own and every store call yields to the others. Two of them waking one key's waiting run
each found it waiting and each started it: one body ran twice under one id. So every
entry into the pipeline and its gates (an arrival, an ending, a timer entry, a release
notice, a discarded message) runs under :class:`Serial`. What may block on the pool (a
green pool's ``spawn`` waits for a free slot, which a task ending under the lock would
free) is handed over (:meth:`Serial.after`) and done once the lock is let go.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["SERIAL_ATTR", "Serial", "serial"]

logger = logging.getLogger(__name__)

#: Attribute of the consumer holding its :class:`Serial`.
SERIAL_ATTR = "extras_serial"


class Serial:
    """A re-entrant lock whose holder can leave work (:meth:`after`) for when it lets go;
    and timer entries (:meth:`call_after`) and callables (:meth:`wrap`) that take it."""

    def __init__(self, timer: Any) -> None:
        self.timer = timer
        self._lock = threading.RLock()
        self._depth = 0  # only the holder writes these two
        self._owner: int | None = None
        self._after: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()

    def __enter__(self) -> None:
        self._lock.acquire()
        self._depth += 1
        self._owner = threading.get_ident()

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth:
            self._lock.release()
            return
        self._owner = None
        after = list(self._after)
        self._after.clear()
        self._lock.release()
        for fn, args in after:
            try:
                fn(*args)
            except Exception:  # as the caller's own loop would: logged, the rest go on
                logger.exception("celery-extras: handing %r over failed", fn)

    def after(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` once the lock is let go (at once when it is not held here)."""
        if self._owner == threading.get_ident():
            self._after.append((fn, args))
        else:
            fn(*args)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self:
            return fn(*args)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """*fn*, taking the lock for each call."""

        def serialized(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return serialized

    def call_after(self, seconds: float, fn: Callable[..., Any], args: tuple[Any, ...] = (),
                   priority: int = 6) -> Any:  # fmt: skip
        """A timer entry calling ``fn(*args)`` under the lock in *seconds*."""
        return self.timer.call_after(seconds, self.run, (fn, *args), priority=priority)


def serial(consumer: Any) -> Serial:
    """The consumer's :class:`Serial`, made on first use."""
    found: Serial | None = getattr(consumer, SERIAL_ATTR, None)
    if found is None:
        found = Serial(consumer.timer)
        setattr(consumer, SERIAL_ATTR, found)
    return found
