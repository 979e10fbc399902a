"""The log-scale histogram: percentiles against an exact computation, bounded buckets."""

from __future__ import annotations

import math
import random

import pytest

from celery_extras.stats.histogram import BUCKETS, HIGHEST, LOWEST, Histogram, bucket_of

BOUND = 2 ** (1 / 32) - 1  # half a bucket of 1/16 octave: 2.2 %


def exact_percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("p", [1, 50, 90, 95, 99, 99.9, 100])
def test_percentiles_are_within_half_a_bucket_of_the_exact_value(seed: int, p: float) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(-5, 2) for _ in range(rng.randint(1, 3000))]
    hist = Histogram()
    for v in values:
        hist.add(v)
    exact = exact_percentile(values, p)
    estimate = hist.percentile(p)
    assert estimate is not None
    assert abs(estimate - exact) <= BOUND * exact * (1 + 1e-12)


def test_count_sum_max_and_merge_are_exact() -> None:
    a, b = Histogram(), Histogram()
    for v in (0.001, 0.002, 0.5):
        a.add(v)
    for v in (3.0, 0.0001):
        b.add(v)
    a.merge(b)
    assert (a.count, a.high, a.low) == (5, 3.0, 0.0001)
    assert a.total == pytest.approx(3.5031, abs=1e-12)
    assert a.percentile(100) == 3.0
    assert a.percentile(20) == pytest.approx(0.0001, rel=BOUND)


def test_a_single_value_is_its_own_percentile() -> None:
    hist = Histogram()
    hist.add(0.0123)
    assert hist.percentile(50) == hist.percentile(99) == 0.0123


def test_out_of_range_values_are_clamped_into_a_fixed_number_of_buckets() -> None:
    hist = Histogram()
    for v in (0.0, -1.0, LOWEST / 10, HIGHEST * 10, 1e300):
        hist.add(v)
    assert set(hist.buckets) == {0, BUCKETS - 1}
    assert bucket_of(LOWEST * 1.5) > 0
    assert hist.percentile(100) == 1e300  # clamped to the largest value seen
    many = Histogram()
    for i in range(100_000):
        many.add(10 ** (i / 10_000 - 7))
    assert len(many.buckets) <= BUCKETS


def test_empty_and_invalid_percentiles() -> None:
    assert Histogram().percentile(50) is None
    with pytest.raises(ValueError):
        Histogram().percentile(0)
    with pytest.raises(ValueError):
        Histogram().percentile(101)
