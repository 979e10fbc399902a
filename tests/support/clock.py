"""A clock the test moves by hand, for the pure algorithms' injectable clocks."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """``clock()`` returns ``clock.now``; tests set or advance ``now`` themselves."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
