"""client-go style retry limiters: how long to wait before retrying an item.

Modelled on Kubernetes' ``workqueue/default_rate_limiters.go``. Every limiter has
``when(item) -> seconds`` (called once per failure), ``forget(item)`` (called on
success) and ``num_requeues(item)``. Per-item failure memory sits behind a
:class:`~celery_extras.retries.failure_memory.Counts`, and :meth:`RetryPolicy.bind`
returns a copy whose memory lives elsewhere (Redis, in a worker).

Arguments are checked by :meth:`RetryPolicy.check` rather than in ``__init__``, so
that ``retry_policy(policy=ExponentialBackoff(base=-1, cap=5))`` can report the
task *and* the argument; ``when`` checks on first use, so a bad policy never
computes a wait.
"""

from __future__ import annotations

import copy
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Literal

from ..checks import is_int, is_number
from ..clock import monotonic
from ..limits.rate import parse_rate
from ..limits.token_bucket import TokenBucket
from .failure_memory import Counts, CountsFactory, MemoryCounts

__all__ = [
    "BucketPolicy",
    "ExponentialBackoff",
    "FastSlow",
    "Jitter",
    "MaxOf",
    "RetryPolicy",
    "WithMaxWait",
]


def _seconds(owner: str, name: str, value: object) -> float:
    if not is_number(value):
        raise ValueError(f"{owner} {name}: expected a finite number of seconds, got {value!r}")
    if value < 0:
        raise ValueError(f"{owner} {name}: must be >= 0 seconds, got {value!r}")
    return float(value)


class RetryPolicy(ABC):
    """Decides the delay before an item's next attempt."""

    @abstractmethod
    def when(self, item: str) -> float:
        """Seconds to wait before retrying *item*; counts one more failure of it."""

    @abstractmethod
    def forget(self, item: str) -> None:
        """Stop tracking *item* (it succeeded or was given up)."""

    @abstractmethod
    def num_requeues(self, item: str) -> int:
        """How many times *item* has been retried through this policy."""

    _checked = False

    def check(self) -> None:
        """Raise :class:`ValueError` naming the policy and argument that is wrong."""
        self._checked = True

    def _ready(self) -> None:
        if not self._checked:
            self.check()
            self._checked = True

    def bind(self, counts: CountsFactory, path: str = "p") -> RetryPolicy:
        """A copy of this policy whose per-item memory comes from *counts*."""
        return copy.copy(self)


class _Counting(RetryPolicy):
    """A limiter with per-item failure memory of its own."""

    counts: Counts

    def bind(self, counts: CountsFactory, path: str = "p") -> RetryPolicy:
        bound = copy.copy(self)
        bound.counts = counts(path)
        return bound

    def forget(self, item: str) -> None:
        self.counts.forget(item)

    def num_requeues(self, item: str) -> int:
        return self.counts.get(item)


class ExponentialBackoff(_Counting):
    """``base * 2**failures`` seconds per item, at most *cap* (client-go's item exponential)."""

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self.counts: Counts = MemoryCounts()

    def check(self) -> None:
        self.base = _seconds("ExponentialBackoff", "base", self.base)
        self.cap = _seconds("ExponentialBackoff", "cap", self.cap)
        if self.cap < self.base:
            raise ValueError(
                f"ExponentialBackoff cap: must be >= base ({self.base!r}), got {self.cap!r}"
            )

    def delay(self, failures: int) -> float:
        """The wait after *failures* earlier failures, without overflow for any count."""
        try:
            backoff = math.ldexp(self.base, failures)  # base * 2**failures, exactly
        except OverflowError:
            return self.cap
        return min(backoff, self.cap)

    def when(self, item: str) -> float:
        self._ready()
        return self.delay(self.counts.incr(item) - 1)

    def __repr__(self) -> str:
        return f"ExponentialBackoff(base={self.base!r}, cap={self.cap!r})"


class FastSlow(_Counting):
    """*fast* seconds for an item's first *max_fast* failures, then *slow* seconds."""

    def __init__(self, fast: float, slow: float, max_fast: int) -> None:
        self.fast = fast
        self.slow = slow
        self.max_fast = max_fast
        self.counts: Counts = MemoryCounts()

    def check(self) -> None:
        self.fast = _seconds("FastSlow", "fast", self.fast)
        self.slow = _seconds("FastSlow", "slow", self.slow)
        m = self.max_fast
        if not is_int(m, minimum=0):
            raise ValueError(f"FastSlow max_fast: expected an integer >= 0, got {m!r}")

    def when(self, item: str) -> float:
        self._ready()
        return self.fast if self.counts.incr(item) <= self.max_fast else self.slow

    def __repr__(self) -> str:
        return f"FastSlow(fast={self.fast!r}, slow={self.slow!r}, max_fast={self.max_fast!r})"


class MaxOf(RetryPolicy):
    """The longest wait any of *policies* asks for (each counts the failure)."""

    def __init__(self, *policies: RetryPolicy) -> None:
        self.policies = policies

    def check(self) -> None:
        if not self.policies or not all(isinstance(p, RetryPolicy) for p in self.policies):
            raise ValueError(f"MaxOf policies: expected retry policies, got {self.policies!r}")
        for p in self.policies:
            p.check()

    def when(self, item: str) -> float:
        self._ready()
        return max([p.when(item) for p in self.policies])  # every policy counts the failure

    def forget(self, item: str) -> None:
        for p in self.policies:
            p.forget(item)

    def num_requeues(self, item: str) -> int:
        return max(p.num_requeues(item) for p in self.policies)

    def bind(self, counts: CountsFactory, path: str = "p") -> RetryPolicy:
        return MaxOf(*(p.bind(counts, f"{path}.{i}") for i, p in enumerate(self.policies)))

    def __repr__(self) -> str:
        return f"MaxOf({', '.join(map(repr, self.policies))})"


class _Wrapper(RetryPolicy):
    """A policy that changes the wait of the one it wraps."""

    policy: RetryPolicy

    def forget(self, item: str) -> None:
        self.policy.forget(item)

    def num_requeues(self, item: str) -> int:
        return self.policy.num_requeues(item)

    def bind(self, counts: CountsFactory, path: str = "p") -> RetryPolicy:
        bound = copy.copy(self)
        bound.policy = self.policy.bind(counts, f"{path}.0")
        return bound


class WithMaxWait(_Wrapper):
    """*policy*, but never more than *max_wait* seconds."""

    def __init__(self, policy: RetryPolicy, max_wait: float) -> None:
        self.policy = policy
        self.max_wait = max_wait

    def check(self) -> None:
        if not isinstance(self.policy, RetryPolicy):
            raise ValueError(f"WithMaxWait policy: expected a retry policy, got {self.policy!r}")
        self.policy.check()
        self.max_wait = _seconds("WithMaxWait", "max_wait", self.max_wait)

    def when(self, item: str) -> float:
        self._ready()
        return min(self.policy.when(item), self.max_wait)

    def __repr__(self) -> str:
        return f"WithMaxWait({self.policy!r}, max_wait={self.max_wait!r})"


class Jitter(_Wrapper):
    """*policy* with random spread, so retries of many items do not arrive together.

    ``"full"``: uniform in ``[0, d]``; ``"equal"``: ``d/2`` plus uniform in ``[0, d/2]``
    (never less than half the wait). *seed* makes the sequence reproducible.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        mode: Literal["full", "equal"] = "full",
        seed: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy
        self.mode = mode
        self.rng = rng if rng is not None else random.Random(seed)

    def check(self) -> None:
        if not isinstance(self.policy, RetryPolicy):
            raise ValueError(f"Jitter policy: expected a retry policy, got {self.policy!r}")
        if self.mode not in ("full", "equal"):
            raise ValueError(f"Jitter mode: expected 'full' or 'equal', got {self.mode!r}")
        self.policy.check()

    def when(self, item: str) -> float:
        self._ready()
        delay = self.policy.when(item)
        if self.mode == "full":
            return self.rng.uniform(0.0, delay)
        return delay / 2 + self.rng.uniform(0.0, delay / 2)

    def __repr__(self) -> str:
        return f"Jitter({self.policy!r}, mode={self.mode!r})"


class BucketPolicy(RetryPolicy):
    """All items together retried at most *rate* per second, *burst* at once.

    client-go's ``BucketRateLimiter``: an overall limit, not a per-item one, so it
    keeps no per-item memory (``num_requeues`` is 0). Its bucket is per process.
    """

    def __init__(
        self, rate: float | str, burst: int = 1, clock: Callable[[], float] = monotonic
    ) -> None:
        self.rate_arg = rate
        self.burst = burst
        self.clock = clock
        self.bucket: TokenBucket | None = None

    def check(self) -> None:
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ValueError(f"BucketPolicy burst: expected an integer >= 1, got {self.burst!r}")
        try:
            rate = parse_rate(self.rate_arg)
        except ValueError as exc:
            raise ValueError(f"BucketPolicy {exc}") from None
        if self.bucket is None:
            self.bucket = TokenBucket(rate, self.burst, self.clock)

    def when(self, item: str) -> float:
        self._ready()
        assert self.bucket is not None
        return self.bucket.reserve()

    def forget(self, item: str) -> None:
        pass

    def num_requeues(self, item: str) -> int:
        return 0

    def __repr__(self) -> str:
        return f"BucketPolicy(rate={self.rate_arg!r}, burst={self.burst!r})"
