"""Simulated time for tests: it stands still until the test moves it.

:class:`SimulatedClock` is a :class:`celery_extras.clock.TimeSource`. While it is in use
(:func:`celery_extras.clock.simulate`), every celery-extras clock reads it, in the worker
and in the store's scripts. :meth:`SimulatedClock.advance` moves it through every parked
wait that falls due on the way, in order, letting the workers attached to it settle after
each, so that a retry due at 2 s and its next one at 6 s both run within ``advance(10)``.
No Celery import: the workers are :class:`Attached` objects (the plugin's in-process ones).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Protocol

__all__ = ["Attached", "SimulatedClock"]

#: Where the simulated monotonic clock starts (any value: only differences are read).
_MONOTONIC_START = 1_000_000.0
#: Parked waits one :meth:`SimulatedClock.advance` may pass before it gives up (a loop).
_MOST_STEPS = 100_000


class Attached(Protocol):
    """A worker that simulated time moves: what is parked for it, and when it is quiet."""

    def next_due(self) -> float | None:
        """The wall time (simulated) of its earliest parked wait, or ``None``."""

    def release_due(self) -> None:
        """Send on every parked wait due now (simulated)."""

    def settle(self) -> None:
        """Return once it has nothing left to do now (or raise when it never gets there)."""


class SimulatedClock:
    """Wall and monotonic time that move only when :meth:`advance` is called.

    It starts at the real wall time, in whole seconds (or at *start*, seconds since the
    epoch), so dates read naturally in logs and sums of simple steps stay exact.
    """

    def __init__(self, start: float | None = None) -> None:
        self.start = float(int(time.time())) if start is None else float(start)
        self._elapsed_us = 0  # whole microseconds: steps of 0.1 s add up to 0.3 s exactly
        self._attached: list[Attached] = []
        self._lock = threading.Lock()

    @property
    def elapsed(self) -> float:
        """Simulated seconds since the clock was made."""
        return self._elapsed_us / 1e6

    def wall(self) -> float:
        return self.start + self._elapsed_us / 1e6

    def monotonic(self) -> float:
        return _MONOTONIC_START + self._elapsed_us / 1e6

    def attach(self, worker: Attached) -> None:
        self._attached.append(worker)

    def detach(self, worker: Attached) -> None:
        if worker in self._attached:
            self._attached.remove(worker)

    def advance(self, seconds: float) -> None:
        """Move time *seconds* ahead, stopping at each parked wait due on the way: the wait is
        released and the workers settle before time moves on."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"advance({seconds!r}): expected seconds as a number")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"advance({seconds!r}): expected finite seconds >= 0")
        with self._lock:
            target = self._elapsed_us + round(seconds * 1e6)
            self._settle()
            for _ in range(_MOST_STEPS):
                due = self._next_due()
                if due is None or due > target:
                    break
                self._elapsed_us = max(self._elapsed_us, due)
                self._release()
            else:
                raise RuntimeError(
                    f"advance({seconds:g}): more than {_MOST_STEPS} parked waits fell due "
                    "on the way (does a task park itself again at once?)"
                )
            self._elapsed_us = target

    def _next_due(self) -> int | None:
        """The earliest parked wait of the attached workers, in elapsed microseconds."""
        dues = [d for d in (w.next_due() for w in self._attached) if d is not None]
        return round((min(dues) - self.start) * 1e6) if dues else None

    def _release(self) -> None:
        for worker in self._attached:
            worker.release_due()
        self._settle()

    def _settle(self) -> None:
        for worker in self._attached:
            worker.settle()
