"""A local token bucket with burst, reservations and ``expected_time``.

Kept as a theoretical arrival time (GCRA): one float instead of a token count
and a timestamp, refilled lazily from the injected clock. ``reserve`` hands out
a future slot and goes into debt, which is what lets a worker schedule a task
exactly once instead of polling for a token; ``consume`` is the classic
all-or-nothing take. The same arithmetic runs in Redis for global buckets.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["TokenBucket"]

_EPSILON = 1e-9  # float noise in the subtraction below is not a wait


class TokenBucket:
    """*rate* tokens per second, at most *burst* at once; *clock* returns seconds."""

    __slots__ = ("_tat", "burst", "clock", "interval", "rate")

    def __init__(
        self, rate: float, burst: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self._tat = float("-inf")  # theoretical arrival time of the next token
        self.rate = self.interval = 0.0
        self.burst = 1
        self.set_rate(rate, burst)

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

    @property
    def tolerance(self) -> float:
        """How far ahead of now the bucket may be booked and still hand a token out at once."""
        return (self.burst - 1) * self.interval

    def expected_time(self, tokens: int = 1) -> float:
        """Seconds until *tokens* could be taken at once (0 when they can be now)."""
        now = self.clock()
        tat = max(self._tat, now)
        wait = tat + (tokens - 1) * self.interval - self.tolerance - now
        return wait if wait > _EPSILON else 0.0

    def can_consume(self, tokens: int = 1) -> bool:
        """Take *tokens* if they are all there now; ``False`` (and take nothing) otherwise."""
        if tokens > self.burst or self.expected_time(tokens) > 0:
            return False
        self._tat = max(self._tat, self.clock()) + tokens * self.interval
        return True

    def reserve(self, tokens: int = 1) -> float:
        """Book *tokens* and return the seconds to wait before using them (0: use now).

        Later callers queue behind earlier ones, so waits are handed out in order and
        no window of one second ever sees more than ``rate + burst`` tokens.
        """
        wait = self.expected_time(tokens)
        self._tat = max(self._tat, self.clock()) + tokens * self.interval
        return wait

    def idle(self) -> bool:
        """True when the bucket is full again, i.e. indistinguishable from a new one."""
        return self._tat <= self.clock()
