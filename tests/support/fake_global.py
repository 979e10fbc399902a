"""The store's global buckets on a fake clock: the rule of ``scripts/bucket_acquire.lua``
(:func:`celery_extras.limits.all_of.admit_all`) over local token buckets, or a failing store."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from celery_extras.bounds import MAX_WAIT
from celery_extras.limits.all_of import admit_all
from celery_extras.limits.redis_bucket import Acquired, Take
from celery_extras.limits.token_bucket import TokenBucket


class FakeGlobal:
    """Global buckets by limit and key; *error* makes every call fail, *wait* answers it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.buckets: dict[tuple[str, str], TokenBucket] = {}
        self.error: Exception | None = None
        self.wait: float | None = None
        self.calls = 0

    def bucket(self, take: Take) -> TokenBucket:
        found = self.buckets.get((take.limit, take.key))
        if found is None:
            found = self.buckets[(take.limit, take.key)] = TokenBucket(
                take.rate, take.burst, self.clock
            )
        return found

    def acquire(
        self, task: str, enforcing: Sequence[Take], shadow: Sequence[Take] = (), floor: float = 0.0
    ) -> Acquired:
        self.calls += 1
        if self.error is not None:
            raise self.error
        if self.wait is not None:
            booked = 0 if self.wait <= MAX_WAIT else None
            return Acquired(self.wait, booked, (self.wait,) * (len(enforcing) + len(shadow)))
        takes = [(self.bucket(t), t.tokens) for t in enforcing]
        own = [b.expected_time(n) if n else 0.0 for b, n in takes]
        admission = admit_all(takes, floor, MAX_WAIT)
        shadows = [self.bucket(t) for t in shadow]
        if admission.wait > 0:
            return Acquired(admission.wait, admission.booked, (*own, *(0.0 for _ in shadows)))
        shadow_waits = [
            min(MAX_WAIT, b.reserve(t.tokens, MAX_WAIT))
            for b, t in zip(shadows, shadow, strict=True)
        ]
        return Acquired(0.0, None, (*own, *shadow_waits))

    def report_ignored(self, name: str, reason: str) -> None:
        pass
