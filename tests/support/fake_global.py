"""The store's global buckets on a fake clock: the rule of ``scripts/bucket_acquire.lua``
(:func:`celery_extras.limits.all_of.admit_all`) over local token buckets, or a failing store."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from celery_extras.bounds import MAX_WAIT
from celery_extras.limits.all_of import admit_all
from celery_extras.limits.redis_bucket import Acquired, LimitTake
from celery_extras.limits.token_bucket import TokenBucket


class FakeGlobal:
    """Global buckets by limit and key; *error* makes every call fail, *wait* answers it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.buckets: dict[tuple[str, str], TokenBucket] = {}
        self.error: Exception | None = None
        self.wait: float | None = None
        self.calls = 0

    def bucket(self, take: LimitTake) -> TokenBucket:
        found = self.buckets.get((take.limit, take.key))
        if found is None:
            found = TokenBucket(take.rate, take.burst, self.clock)
            self.buckets[(take.limit, take.key)] = found
        return found

    def acquire(
        self,
        task: str,
        enforcing: Sequence[LimitTake],
        shadow: Sequence[LimitTake] = (),
        floor: float = 0.0,
        tagged: bool = False,
    ) -> Acquired:
        self.calls += 1
        if self.error is not None:
            raise self.error
        count = len(enforcing) + len(shadow)
        if self.wait is not None:
            booked = self.wait <= MAX_WAIT
            return Acquired(self.wait, 0 if booked else None, (self.wait,) * count,
                            (booked,) * count)  # fmt: skip
        takes = [(self.bucket(t), t.tokens, t.narrow) for t in enforcing]
        own = [b.expected_time(n) if n else 0.0 for b, n, _ in takes]
        admission = admit_all(takes, floor, MAX_WAIT)
        if admission.wait > 0:
            return Acquired(admission.wait, admission.binding, (*own, *(0.0,) * len(shadow)),
                            (*admission.booked, *(False,) * len(shadow)))  # fmt: skip
        shadows = [(self.bucket(t), t.tokens) for t in shadow]
        waits = [min(MAX_WAIT, b.reserve(n, MAX_WAIT)) for b, n in shadows]
        return Acquired(0.0, None, (*own, *waits), (*admission.booked, *(True,) * len(shadow)))

    def report_ignored(self, name: str, reason: str) -> None:
        pass
