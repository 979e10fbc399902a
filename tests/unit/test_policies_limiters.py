"""Pure limiters with a fake clock: token bucket, rate syntax, client-go retry limiters."""

from __future__ import annotations

import random

import pytest

from celery_extras import (
    BucketPolicy,
    ExponentialBackoff,
    FastSlow,
    Jitter,
    MaxOf,
    MemoryCounts,
    TokenBucket,
    WithMaxWait,
    parse_rate,
)
from celery_extras.limits.rate import format_rate
from celery_extras.retries.failure_memory import Counts
from tests.support.clock import FakeClock

# -- rate syntax ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "per_second"),
    [
        ("10/s", 10.0),
        ("120/m", 2.0),
        ("3600/h", 1.0),
        ("5", 5.0),
        (2.5, 2.5),
        (" 1/S ", 1.0),
        ("1000000/s", 1e6),
        ("0.05/h", 0.05 / 3600),
        (1 / 86400, 1 / 86400),
    ],
)
def test_parse_rate_reads_celery_syntax_within_bounds(text: object, per_second: float) -> None:
    assert parse_rate(text) == per_second


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10/d", "unit must be one of s, m, h"),
        ("ten/s", "expected a number of tasks"),
        ("0/s", "must be between one a day .1/86400 per second. and 1000000/s"),
        ("-1/s", "must be between one a day"),
        ("inf/s", "must be between one a day"),
        ("nan/s", "must be between one a day"),
        ("1e-300/s", "must be between one a day"),
        ("0.01/h", "must be between one a day"),
        ("1e308/s", "must be between one a day"),
        ("1000001/s", "must be between one a day"),
        (10**400, "must be between one a day"),
        ("1" * 33 + "/s", "too long for a rate"),
        (True, "expected e.g. '10/s'"),
        (None, "expected a string such as '10/s'"),
    ],
)
def test_parse_rate_rejects_garbage_with_the_reason(text: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rate(text)


def test_format_rate_round_trips() -> None:
    assert [format_rate(r) for r in (10.0, 0.5, 1 / 3600, 0.3)] == ["10/s", "30/m", "1/h", "18/m"]


# -- token bucket ---------------------------------------------------------------------------


def test_bucket_starts_full_and_refills_at_its_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, burst=3, clock=clock)
    assert [bucket.can_consume() for _ in range(4)] == [True, True, True, False]
    assert bucket.expected_time() == pytest.approx(0.1)
    clock.now += 0.1
    assert bucket.can_consume() and not bucket.can_consume()
    clock.now += 10  # long idle: refills to burst, never beyond
    assert bucket.idle()
    assert [bucket.can_consume() for _ in range(4)] == [True, True, True, False]


def test_reserve_books_consecutive_slots_in_order() -> None:
    clock = FakeClock()
    bucket = TokenBucket(4, burst=2, clock=clock)
    waits = [bucket.reserve() for _ in range(6)]
    assert waits == pytest.approx([0, 0, 0.25, 0.5, 0.75, 1.0])
    clock.now += 0.5
    assert bucket.reserve() == pytest.approx(0.75)  # behind everything booked before


def test_reserve_never_exceeds_rate_plus_burst_in_any_second() -> None:
    clock = FakeClock(0.0)
    bucket = TokenBucket(20, burst=5, clock=clock)
    slots = []
    for step in range(400):  # arrivals in clumps, some bursts after idle gaps
        clock.now = step * 0.01 + (3.0 if step > 200 else 0.0)
        slots.append(clock.now + bucket.reserve())
    slots.sort()
    worst = max(sum(1 for s in slots if t <= s < t + 1) for t in slots)
    assert worst <= 20 + 5


def test_expected_time_for_several_tokens() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2, burst=4, clock=clock)
    assert bucket.expected_time(4) == 0
    assert bucket.reserve(4) == 0
    assert bucket.expected_time(1) == pytest.approx(0.5)
    assert bucket.expected_time(3) == pytest.approx(1.5)
    assert not bucket.can_consume(5)  # more than the burst can never be taken at once


def test_set_rate_applies_from_now_on() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1, clock=clock)
    assert bucket.reserve() == 0 and bucket.reserve() == pytest.approx(1.0)
    bucket.set_rate(10)
    assert bucket.reserve() == pytest.approx(2.0)  # booked slots stay booked
    assert bucket.reserve() == pytest.approx(2.1)
    with pytest.raises(ValueError, match="rate must be > 0"):
        bucket.set_rate(0)
    with pytest.raises(ValueError, match="burst must be >= 1"):
        bucket.set_rate(1, burst=0)


# -- retry limiters -------------------------------------------------------------------------


def test_exponential_backoff_per_item_with_cap_and_forget() -> None:
    policy = ExponentialBackoff(base=0.005, cap=1.0)
    assert [policy.when("a") for _ in range(10)] == pytest.approx(
        [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0]
    )
    assert policy.when("b") == 0.005  # items do not share memory
    assert policy.num_requeues("a") == 10 and policy.num_requeues("b") == 1
    policy.forget("a")
    assert policy.num_requeues("a") == 0 and policy.when("a") == 0.005


def test_exponential_backoff_never_overflows() -> None:
    policy = ExponentialBackoff(base=1.0, cap=300.0)
    assert policy.delay(1023) == 300.0
    assert policy.delay(10**6) == 300.0
    assert ExponentialBackoff(base=0.0, cap=5.0).delay(10**6) == 0.0


def test_fast_slow() -> None:
    policy = FastSlow(fast=0.01, slow=5.0, max_fast=3)
    assert [policy.when("x") for _ in range(5)] == [0.01, 0.01, 0.01, 5.0, 5.0]
    policy.forget("x")
    assert policy.when("x") == 0.01 and policy.num_requeues("x") == 1


def test_max_of_counts_in_every_policy_and_takes_the_longest() -> None:
    policy = MaxOf(ExponentialBackoff(0.001, 1000.0), FastSlow(0.01, 0.5, 2))
    assert [policy.when("i") for _ in range(5)] == pytest.approx([0.01, 0.01, 0.5, 0.5, 0.5])
    assert policy.num_requeues("i") == 5
    assert [policy.when("i") for _ in range(5)][-1] == pytest.approx(0.512)  # 0.001 * 2**9
    policy.forget("i")
    assert policy.num_requeues("i") == 0


def test_with_max_wait_caps_the_wait_only() -> None:
    policy = WithMaxWait(ExponentialBackoff(1.0, 1000.0), max_wait=3.0)
    assert [policy.when("i") for _ in range(4)] == [1.0, 2.0, 3.0, 3.0]
    assert policy.num_requeues("i") == 4


def test_jitter_full_and_equal_are_seeded_and_bounded() -> None:
    full = Jitter(FastSlow(1.0, 1.0, 0), mode="full", seed=7)
    equal = Jitter(FastSlow(1.0, 1.0, 0), mode="equal", seed=7)
    full_waits = [full.when("i") for _ in range(200)]
    equal_waits = [equal.when("i") for _ in range(200)]
    assert all(0 <= w <= 1.0 for w in full_waits) and min(full_waits) < 0.1
    assert all(0.5 <= w <= 1.0 for w in equal_waits)
    again = Jitter(FastSlow(1.0, 1.0, 0), mode="full", seed=7)
    assert [again.when("i") for _ in range(200)] == full_waits
    rng = random.Random(7)
    assert full_waits[:3] == [rng.uniform(0, 1.0) for _ in range(3)]


def test_bucket_policy_is_overall_not_per_item() -> None:
    clock = FakeClock()
    policy = BucketPolicy("10/s", burst=2, clock=clock)
    assert [policy.when(i) for i in "abcd"] == pytest.approx([0, 0, 0.1, 0.2])
    assert policy.num_requeues("a") == 0
    policy.forget("a")  # no per-item memory to forget


class SharedCounts:
    """Counts kept in one dict shared by several bound policies (what Redis does)."""

    def __init__(self, store: dict[str, int], prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def incr(self, item: str) -> int:
        key = f"{self.prefix}/{item}"
        self.store[key] = self.store.get(key, 0) + 1
        return self.store[key]

    def get(self, item: str) -> int:
        return self.store.get(f"{self.prefix}/{item}", 0)

    def forget(self, item: str) -> None:
        self.store.pop(f"{self.prefix}/{item}", None)


def test_bind_moves_the_memory_and_keeps_composites_apart() -> None:
    store: dict[str, int] = {}

    def factory(path: str) -> Counts:
        return SharedCounts(store, path)

    policy = WithMaxWait(MaxOf(ExponentialBackoff(1.0, 60.0), FastSlow(0.1, 9.0, 1)), 30.0)
    one, two = policy.bind(factory), policy.bind(factory)  # e.g. two workers
    assert one.when("x") == 1.0
    assert two.when("x") == 9.0  # saw the first failure: exponential 2.0, fast/slow slow
    assert store == {"p.0.0/x": 2, "p.0.1/x": 2}
    assert one.num_requeues("x") == 2
    two.forget("x")
    assert store == {} and policy.num_requeues("x") == 0  # the unbound original is untouched


def test_memory_counts() -> None:
    counts = MemoryCounts()
    assert [counts.incr("a"), counts.incr("a"), counts.get("a"), counts.get("b")] == [1, 2, 2, 0]
    counts.forget("a")
    counts.forget("never")
    assert counts.get("a") == 0


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (ExponentialBackoff(base=-1, cap=5), "ExponentialBackoff base: must be >= 0"),
        (ExponentialBackoff(base=2, cap=1), r"ExponentialBackoff cap: must be >= base \(2.0\)"),
        (ExponentialBackoff(base="1", cap=1), "ExponentialBackoff base: expected a finite"),  # type: ignore[arg-type]
        (FastSlow(0.1, 1.0, max_fast=-1), "FastSlow max_fast: expected an integer >= 0"),
        (MaxOf(), "MaxOf policies: expected retry policies"),
        (WithMaxWait(FastSlow(1, 1, 1), max_wait=float("nan")), "WithMaxWait max_wait"),
        (Jitter(FastSlow(1, 1, 1), mode="half"), "Jitter mode: expected 'full' or 'equal'"),  # type: ignore[arg-type]
        (BucketPolicy("fast"), "BucketPolicy rate 'fast'"),
        (MaxOf(ExponentialBackoff(1, 0.5)), "ExponentialBackoff cap"),
    ],
)  # fmt: skip
def test_bad_arguments_are_named(policy: ExponentialBackoff, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        policy.check()
    with pytest.raises(ValueError, match=message):
        policy.when("item")  # a bad policy never computes a wait


@pytest.mark.parametrize("uptime", [30 * 86400.0, 365 * 86400.0])
def test_token_bucket_is_exact_on_a_host_up_for_a_long_time(uptime: float) -> None:
    """The issue's figures: at 30 days the 100th token of a burst waited 9.3 ns, at one year
    150 ns, and ``TokenBucket(10, 3)`` gave True, True, False; all must be exact now."""
    clock = FakeClock(uptime)
    bucket = TokenBucket(10, burst=100, clock=clock)
    assert [bucket.reserve() for _ in range(100)] == [0.0] * 100
    assert bucket.reserve() == pytest.approx(0.1, abs=1e-12)
    small = TokenBucket(10, burst=3, clock=clock)
    assert [small.can_consume() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.1
    assert small.can_consume() is True and small.can_consume() is False
    policy = BucketPolicy(10, burst=100, clock=clock)
    assert [policy.when(f"i{i}") for i in range(100)] == [0.0] * 100
