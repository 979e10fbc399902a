"""A local token bucket with burst, reservations and ``expected_time``.

Kept as a theoretical arrival time (GCRA): one number instead of a token count
and a timestamp, refilled lazily from the injected clock. ``reserve`` hands out
a future slot and goes into debt, which is what lets a worker schedule a task
exactly once instead of polling for a token; ``consume`` is the classic
all-or-nothing take. The same arithmetic runs in Redis for global buckets.

Times are integer nanoseconds since the bucket was created, so the arithmetic is
exact however long the host has been up: a float of seconds since boot loses
nanoseconds after weeks (at one year, a burst of 100 tokens at 10/s made the
100th wait 150 ns instead of 0, and ``TokenBucket(10, 3)`` refused its third).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..clock import monotonic

__all__ = ["TokenBucket"]

_NS = 1_000_000_000
_NEVER = -(2**62)  # the theoretical arrival time of a bucket that never handed a token out


class TokenBucket:
    """*rate* tokens per second, at most *burst* at once; *clock* returns seconds."""

    __slots__ = ("_interval_ns", "_origin", "_tat", "burst", "clock", "interval", "rate")

    def __init__(self, rate: float, burst: int = 1, clock: Callable[[], float] = monotonic) -> None:
        self.clock = clock
        self._origin = clock()
        self._tat = _NEVER  # theoretical arrival time of the next token, ns since _origin
        self.rate = self.interval = 0.0
        self._interval_ns = 1
        self.burst = 1
        self.set_rate(rate, burst)

    def _ns(self, when: float) -> int:
        return round((when - self._origin) * _NS)

    def _now(self) -> int:
        return self._ns(self.clock())

    def set_rate(self, rate: float, burst: int | None = None) -> None:
        """Change the rate (and burst) from now on; tokens already handed out stay handed out."""
        if not rate > 0:
            raise ValueError(f"rate must be > 0 tokens per second, got {rate!r}")
        if burst is not None:
            if burst < 1:
                raise ValueError(f"burst must be >= 1, got {burst!r}")
            self.burst = int(burst)
        self.rate = float(rate)
        self.interval = 1.0 / self.rate
        self._interval_ns = max(1, math.ceil(_NS / self.rate))  # never faster than the rate

    @property
    def tolerance(self) -> float:
        """How far ahead of now the bucket may be booked and still hand a token out at once."""
        return (self.burst - 1) * self._interval_ns / _NS

    def _wait_ns(self, now: int, tokens: int) -> int:
        tat = max(self._tat, now)
        return tat + (tokens - self.burst) * self._interval_ns - now

    def expected_time(self, tokens: int = 1) -> float:
        """Seconds until *tokens* could be taken at once (0 when they can be now)."""
        return max(0, self._wait_ns(self._now(), tokens)) / _NS

    def can_consume(self, tokens: int = 1) -> bool:
        """Take *tokens* if they are all there now; ``False`` (and take nothing) otherwise."""
        now = self._now()
        if tokens > self.burst or self._wait_ns(now, tokens) > 0:
            return False
        self._tat = max(self._tat, now) + tokens * self._interval_ns
        return True

    def reserve(self, tokens: int = 1, max_wait: float = math.inf) -> float:
        """Book *tokens* and return the seconds to wait before using them (0: use now).

        Later callers queue behind earlier ones, so waits are handed out in order and
        no window of one second ever sees more than ``rate + burst`` tokens. A wait
        longer than *max_wait* books nothing: the caller must ask again later.
        """
        now = self._now()
        wait = max(0, self._wait_ns(now, tokens)) / _NS
        if wait <= max_wait:
            self._tat = max(self._tat, now) + tokens * self._interval_ns
        return wait

    def booked_until(self) -> float:
        """When the last token handed out may be used (``-inf`` for a new bucket)."""
        if self._tat == _NEVER:
            return -math.inf
        return self._origin + (self._tat - self.burst * self._interval_ns) / _NS

    def charge_until(self, when: float) -> None:
        """Count the bucket as used up to *when*: its next token comes one interval later,
        with no burst before it (slots handed out elsewhere, e.g. by a global bucket)."""
        if math.isfinite(when):
            self._tat = max(self._tat, self._ns(when) + self.burst * self._interval_ns)

    def idle(self) -> bool:
        """True when the bucket is full again, i.e. indistinguishable from a new one."""
        return self._tat <= self._now()
