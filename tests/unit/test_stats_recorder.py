"""Recorder with a fake clock: counts per name, the contract's figures, the name cap, signals."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery import Celery

from celery_extras.signals import task_rate_limited
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
from celery_extras.stats.recording import _Receivers
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
    assert set(figures) == {*COUNTERS, "runtime"}
    assert figures["received"] == [3, 3, 3, 3]
    assert figures["succeeded"] == [2, 2, 2, 2]
    assert figures["failed"] == [1, 1, 1, 1]
    assert figures["rate_limited"] == [0, 0, 0, 0]
    assert set(figures["runtime"]) == {"count", "sum", "max", "p50", "p95", "p99"}
    assert figures["runtime"]["count"] == 2
    assert figures["runtime"]["sum"] == 0.75
    assert figures["runtime"]["max"] == figures["runtime"]["p99"] == 0.5
    assert figures["runtime"]["p50"] == pytest.approx(0.25, rel=0.023)


def test_names_idle_for_longer_than_the_longest_window_are_left_out() -> None:
    clock = FakeClock(5000.0)
    rec = Recorder(clock)
    rec.count("old", RECEIVED)
    clock.now += 30
    rec.count("new", RECEIVED)
    clock.now += 1
    assert set(rec.snapshot([1, 10])["tasks"]) == {"new"}
    assert set(rec.snapshot([1, 60])["tasks"]) == {"old", "new"}
    clock.now += 1
    assert rec.snapshot([1])["tasks"] == {}


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
