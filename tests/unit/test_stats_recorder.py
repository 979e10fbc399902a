"""Recorder with a fake clock: counts per name, the contract's figures, the name cap, signals."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery import Celery

from celery_extras.signals import (
    task_concurrency_limited,
    task_parked,
    task_rate_limited,
    task_released,
)
from celery_extras.stats.histogram import bucket_of
from celery_extras.stats.recorder import (
    COUNTERS,
    FAILED,
    OTHER,
    RATE_LIMITED,
    RECEIVED,
    SUCCEEDED,
    LockedRecorder,
    Recorder,
)
from celery_extras.stats.steps import _Receivers
from tests.support.clock import FakeClock


def test_snapshot_has_exactly_the_contract_fields() -> None:
    clock = FakeClock(5000.0)
    rec = Recorder(clock)
    for _ in range(3):
        rec.count("a", RECEIVED)
    rec.count("a", SUCCEEDED, 2)
    rec.count("a", FAILED)
    rec.runtime("a", 0.25)
    rec.runtime("a", 0.5)
    clock.now += 1
    snap = rec.snapshot([1, 10, 60, 3600])
    assert snap["windows"] == [1, 10, 60, 3600]
    figures = snap["tasks"]["a"]
    assert set(figures) == {*COUNTERS, "runtime", "total", "runtime_total"}
    assert figures["received"] == [3, 3, 3, 3]
    assert figures["succeeded"] == [2, 2, 2, 2]
    assert figures["failed"] == [1, 1, 1, 1]
    assert figures["rate_limited"] == [0, 0, 0, 0]
    assert set(figures["runtime"]) == {"count", "sum", "max", "p50", "p95", "p99"}
    assert figures["runtime"]["count"] == 2
    assert figures["runtime"]["sum"] == 0.75
    assert figures["runtime"]["max"] == figures["runtime"]["p99"] == 0.5
    assert figures["runtime"]["p50"] == pytest.approx(0.25, rel=0.023)


def test_names_idle_for_longer_than_the_longest_window_stay_listed_with_their_totals() -> None:
    """Running totals are Prometheus counters: a name must not vanish when it goes idle."""
    clock = FakeClock(5000.0)
    rec = Recorder(clock)
    assert rec.snapshot([1])["tasks"] == {}
    rec.count("old", RECEIVED)
    clock.now += 30
    rec.count("new", RECEIVED)
    clock.now += 1
    tasks = rec.snapshot([1, 10])["tasks"]
    assert set(tasks) == {"old", "new"}
    assert tasks["old"]["received"] == [0, 0]
    assert tasks["old"]["total"]["received"] == 1
    assert tasks["new"]["received"] == [1, 1]
    clock.now += 7200  # both wheels turned over: only the totals remember
    rec.count("new", RECEIVED)
    tasks = rec.snapshot([1, 3600])["tasks"]
    assert tasks["old"]["received"] == [0, 0] and tasks["old"]["total"]["received"] == 1
    assert tasks["new"]["total"]["received"] == 2


def test_totals_and_runtime_buckets_stay_exact_across_both_wheels() -> None:
    """Events spread over 3 hours: the totals equal the sum written, whatever the wheels dropped."""
    clock = FakeClock(1000.0)
    rec = Recorder(clock)
    written = 0
    runtimes: list[float] = []
    for step in range(3 * 3600 // 7):
        clock.now += 7
        rec.count("t", FAILED, step % 3)
        written += step % 3
        runtime = 0.001 * (1 + step % 50)
        rec.succeeded("t", runtime)
        runtimes.append(runtime)
        if step % 997 == 0:
            rec.snapshot([1, 60, 3600])  # reading must not change what is counted
    figures = rec.snapshot([1, 60, 3600])["tasks"]["t"]
    assert figures["total"]["failed"] == written
    assert figures["total"]["succeeded"] == len(runtimes)
    every = figures["runtime_total"]
    assert every["count"] == len(runtimes)
    assert every["sum"] == pytest.approx(sum(runtimes))
    assert sum(n for _, n in every["buckets"]) == len(runtimes)
    expected: dict[int, int] = {}
    for value in runtimes:
        expected[bucket_of(value)] = expected.get(bucket_of(value), 0) + 1
    assert every["buckets"] == [[i, n] for i, n in sorted(expected.items())]
    assert figures["succeeded"][2] < len(runtimes)  # the hour window forgot the rest


def test_names_beyond_max_tasks_are_counted_under_other() -> None:
    clock = FakeClock(5000.0)
    rec = Recorder(clock, max_tasks=3)
    for i in range(10):
        rec.count(f"t{i}", RECEIVED)
    rec.count("t0", RECEIVED)
    clock.now += 1
    tasks = rec.snapshot([60])["tasks"]
    assert {name: f["received"] for name, f in tasks.items()} == {
        "t0": [2],
        "t1": [1],
        "t2": [1],
        OTHER: [7],
    }


def test_locked_recorder_counts_the_same() -> None:
    clock = FakeClock(5000.0)
    rec = LockedRecorder(clock)
    rec.count("a", RECEIVED, 4)
    rec.runtime("a", 1.0)
    clock.now += 1
    assert rec.snapshot([1])["tasks"]["a"]["received"] == [4]


@pytest.fixture
def recording() -> Iterator[tuple[Celery, Recorder, FakeClock]]:
    app = Celery("stats-unit", set_as_current=False)
    clock = FakeClock(5000.0)
    rec = Recorder(clock)
    receivers = _Receivers(app, rec)
    receivers.connect()
    try:
        yield app, rec, clock
    finally:
        receivers.disconnect()
        app.close()


def test_task_rate_limited_signal_is_counted_for_its_app_only(
    recording: tuple[Celery, Recorder, FakeClock],
) -> None:
    app, rec, clock = recording
    other = Celery("other", set_as_current=False)
    task_rate_limited.send(sender="tasks.fetch", request=SimpleNamespace(app=app), wait=0.5)
    task_rate_limited.send(sender="tasks.fetch", request=None, wait=0.5)
    task_rate_limited.send(sender="tasks.fetch", request=SimpleNamespace(app=other), wait=0.5)
    task_rate_limited.send(sender=None, request=None, wait=0.5)  # no task name: ignored
    clock.now += 1
    figures = rec.snapshot([1])["tasks"]["tasks.fetch"]
    assert figures["rate_limited"] == [2]
    assert figures["received"] == [0]
    other.close()


def test_delay_store_and_concurrency_signals_are_counted(
    recording: tuple[Celery, Recorder, FakeClock],
) -> None:
    app, rec, clock = recording
    other = Celery("other", set_as_current=False)
    task_parked.send(sender="t", request=SimpleNamespace(app=app), due=30.0)
    task_parked.send(sender="t", request=None, due=30.0)  # a retry parked from the pool
    task_parked.send(sender="t", request=SimpleNamespace(app=other), due=30.0)
    task_released.send(sender="t", task_id="id-1")
    task_concurrency_limited.send(sender="t", request=SimpleNamespace(app=app))
    task_concurrency_limited.send(sender=None, request=None)
    clock.now += 1
    figures = rec.snapshot([1])["tasks"]["t"]
    assert (figures["parked"], figures["released"], figures["concurrency_limited"]) == (
        [2],
        [1],
        [1],
    )
    assert figures["total"]["parked"] == 2
    other.close()


def test_disconnected_receivers_count_nothing(
    recording: tuple[Celery, Recorder, FakeClock],
) -> None:
    app, rec, clock = recording
    receivers = _Receivers(app, rec)
    receivers.connect()
    receivers.disconnect()
    task_rate_limited.send(sender="x", request=None, wait=0.1)
    clock.now += 1
    assert rec.snapshot([1])["tasks"]["x"]["rate_limited"] == [1]  # the fixture's receiver only


def test_counter_indices_match_the_contract_order() -> None:
    assert COUNTERS[RECEIVED] == "received"
    assert COUNTERS[RATE_LIMITED] == "rate_limited"


def test_counts_across_rounds_equal_an_exact_count_of_the_events() -> None:
    """The recorder remembers each name's bucket for one round: at every boundary, after
    idle gaps longer than the wheel, and for the name cap, its windows hold exactly
    the events of their seconds."""
    rng = random.Random(7)
    clock = FakeClock(5000.0)
    rec = Recorder(clock, max_tasks=4)
    events: list[tuple[float, str]] = []
    for _ in range(3000):
        clock.now += rng.choice([0.0, 0.001, 0.3, 0.999, 1.0, 2.5, 70.0])
        name = f"t{rng.randrange(6)}"
        rec.count(name, RECEIVED)
        events.append((clock.now, name))
        if rng.random() < 0.02:
            owner = name if name in rec.names() else OTHER
            now = math.floor(clock.now)
            for window in (1, 10, 60):
                got = rec.snapshot([window])["tasks"].get(owner, {}).get("received", [0])[0]
                names = {owner} if owner != OTHER else {n for _, n in events} - set(rec.names())
                want = sum(1 for t, n in events if n in names and now - window <= t < now)
                assert got == want, (clock.now, owner, window)


def test_the_worker_state_gauges_come_from_the_steps_info() -> None:
    from celery_extras.stats.emitter import worker_state

    infos = {
        "extras_policies": {
            "store": "down",
            "waiting": 3,
            "held": 9,
            "concurrency": {"tasks": {"t.c": {"holding": 1, "waiting": 2, "cap": 1}}},
        },
        "extras_sync": {"store": "ok"},
        "extras_delay": {"depth": 12, "store": "down: ConnectionError()"},
        "extras_queues": {"buffered": {"high": 1, "low": 0, "bad": "x"}},
        "extras": {"windows": [1]},
    }
    assert worker_state(infos) == {
        "store": {
            "policies": "down",
            "sync": "ok",
            "delay": "down: ConnectionError()",
            "limits": "down",  # the limits' figures are at the top of extras_policies
        },
        "waiting": 3,
        "parked": 12,
        "concurrency": {"t.c": {"holding": 1, "waiting": 2}},
        "buffered": {"high": 1, "low": 0},
    }
    assert worker_state({}) == {}
