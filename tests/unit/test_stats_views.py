"""What monitors show: escaped names, Prometheus histogram buckets, Flower's data and Other tab."""

from __future__ import annotations

import math
import random

import pytest

from celery_extras.flower import LiveState, page_data, readable
from celery_extras.stats.histogram import SCALE, bucket_of, upper_bound
from celery_extras.stats.prometheus import BOUNDS, histogram_buckets
from celery_extras.stats.recorder import Recorder
from celery_extras.stats.schema import RuntimeTotal
from celery_extras.stats.text import printable, truncate
from tests.support.clock import FakeClock


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("proj.fetch", "proj.fetch"),
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("bell\x07\r\n", "bell\\x07\\x0d\\x0a"),
        ("c1\x9b31m", "c1\\x9b31m"),
        ("bidi\u202eevil", "bidi\\u202eevil"),
        ("del\x7f", "del\\x7f"),
        ("été 日本", "été 日本"),
    ],
)
def test_printable_escapes_control_and_format_characters(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert printable(raw).isprintable()


def test_truncate_marks_the_cut() -> None:
    assert truncate("abcdef", 4) == "abc~"
    assert truncate("abc", 4) == "abc"
    assert truncate("abc", 0) == ""


def test_histogram_buckets_are_exact_at_each_bound_and_cumulative() -> None:
    rng = random.Random(7)
    values = [2 ** rng.uniform(-16, 15) for _ in range(5000)]
    buckets: dict[int, int] = {}
    for v in values:
        buckets[bucket_of(v)] = buckets.get(bucket_of(v), 0) + 1
    bounds: dict[float, int] = {}
    for index, n in buckets.items():
        bounds[upper_bound(index, **SCALE)] = bounds.get(upper_bound(index, **SCALE), 0) + n
    pairs = histogram_buckets(RuntimeTotal(len(values), sum(values), bounds))
    assert len(pairs) == len(BOUNDS) + 1 and pairs[-1] == ("+Inf", len(values))
    counts = [n for _, n in pairs]
    assert counts == sorted(counts)
    for (le, n), bound in zip(pairs, BOUNDS, strict=False):
        assert n == sum(1 for v in values if v < bound), le  # values on a bound are 0-probability


def test_page_data_sums_workers_and_escapes_names() -> None:
    clock = FakeClock(1000.0)
    recorders = {host: Recorder(clock) for host in ("w1@h", "w\x1b[2J@h")}
    for rec in recorders.values():
        for _ in range(3):
            rec.succeeded("t\x07", 0.01)
        rec.count("t\x07", 3)  # failed
    clock.now += 1
    state = LiveState(clock)
    for host, rec in recorders.items():
        state.on_event({"type": "worker-throughput", "hostname": host, "timestamp": 1.0,
                        **rec.snapshot([1, 10, 60, 3600])})  # fmt: skip
    data = page_data(state)
    assert set(data["workers"]) == {"w1@h", "w\\x1b[2J@h"}
    cluster = data["cluster"]["tasks"]["t\\x07"]
    assert (cluster["succeeded"], cluster["failed"]) == (6, 2)
    assert cluster["rates"] == [8.0, 0.8, 0.13, 0.0]
    assert cluster["p95_ms"] == pytest.approx(10, rel=0.03)


def test_the_other_tab_is_short_rounded_text() -> None:
    figures = {"windows": [1, 60], "tasks": {"t.a": {
        "received": [0, 7], "succeeded": [0, 6], "failed": [0, 1], "retried": [0, 0],
        "rejected": [0, 0], "revoked": [0, 0], "rate_limited": [0, 2],
        "runtime": {"count": 6, "sum": 0.1, "max": 0.05, "p50": 0.0123456789, "p95": 0.04567891,
                    "p99": 0.05}}}}  # fmt: skip
    html = readable("extras", figures)
    assert (
        html
        == "t.a: 0.117/s over 1m, received 7, succeeded 6, failed 1, rate limited 2, p95 45.7 ms"
    )
    sync = readable("extras_sync", {"store": "ok", "load_seconds": 0.005512345, "last_sync": 1e10,
                                    "nested": {"a": {"b": {"c": 1}}}})  # fmt: skip
    assert (
        "load_seconds: 0.00551" in sync
        and "{'" not in sync
        and "nested: {a: {b: (1 entries)}}" in sync
    )
    assert readable("x", "<script>\x1b") == "&lt;script&gt;\\x1b"
    assert not math.isnan(float(readable("uptime", 3.14159)))
