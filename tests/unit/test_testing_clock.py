"""Simulated time (celery_extras.testing.clock): frozen until advanced, and advanced through
every parked wait on the way, in order, the workers settling after each."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from celery_extras import clock
from celery_extras.testing.clock import SimulatedClock
from tests.support.clock import simulated

START = 1_000_000.0


class FakeWorker:
    """Parked waits as wall times; a release runs what is due, and a run may park again
    (a retry policy's next wait)."""

    def __init__(self, sim: SimulatedClock, dues: list[float], again: list[float]) -> None:
        self.sim, self.dues, self.again = sim, sorted(dues), list(again)
        self.ran: list[float] = []
        self.calls: list[str] = []

    def next_due(self) -> float | None:
        return self.dues[0] if self.dues else None

    def release_due(self) -> None:
        self.calls.append("release")
        now = self.sim.wall()
        while self.dues and self.dues[0] <= now:
            self.dues.pop(0)
            self.ran.append(now - START)
            if self.again:
                self.dues = sorted([*self.dues, now + self.again.pop(0)])

    def settle(self) -> None:
        self.calls.append("settle")


@pytest.fixture
def sim() -> Iterator[SimulatedClock]:
    with simulated(START) as clock_:
        yield clock_


def test_time_stands_still_until_advanced_and_moves_every_clock(sim: SimulatedClock) -> None:
    wall, mono = clock.wall(), clock.monotonic()
    assert wall == START and clock.wall() == wall and clock.monotonic() == mono
    assert clock.store_time() == "1000000000000"  # microseconds, for the store's scripts
    sim.advance(2.5)
    assert clock.wall() == START + 2.5 and clock.monotonic() == mono + 2.5
    assert clock.store_time() == "1000002500000"
    assert sim.elapsed == 2.5


def test_real_time_again_after_the_simulation() -> None:
    clock.simulate(SimulatedClock(start=START))
    clock.simulate(None)
    assert not clock.simulated() and clock.store_time() == "" and clock.wall() > START


def test_an_advance_stops_at_each_wait_due_on_the_way_in_order(sim: SimulatedClock) -> None:
    """A task failing at 0 retried after 2, 4 and 8 s: one advance(20) runs all three, at
    2, 6 and 14 s, each retry parked by the run before it."""
    worker = FakeWorker(sim, [START + 2], again=[4, 8])
    sim.attach(worker)
    sim.advance(20)
    assert worker.ran == [2.0, 6.0, 14.0]
    assert sim.elapsed == 20.0 and worker.dues == []


def test_a_wait_due_after_the_advance_stays_parked(sim: SimulatedClock) -> None:
    worker = FakeWorker(sim, [START + 1, START + 3], again=[])
    sim.attach(worker)
    sim.advance(2.999)
    assert worker.ran == [1.0] and worker.dues == [START + 3]
    sim.advance(0.001)
    assert worker.ran == [1.0, 3.0]


def test_the_workers_settle_before_time_moves_and_after_each_release(sim: SimulatedClock) -> None:
    worker = FakeWorker(sim, [START + 1, START + 2], again=[])
    sim.attach(worker)
    sim.advance(5)
    assert worker.calls == ["settle", "release", "settle", "release", "settle"]
    sim.detach(worker)
    sim.advance(1)
    assert len(worker.calls) == 5


def test_a_worker_that_parks_at_once_again_is_an_error_not_a_hang(sim: SimulatedClock) -> None:
    class Looping(FakeWorker):
        def next_due(self) -> float:
            return self.sim.wall()

    sim.attach(Looping(sim, [], again=[]))
    with pytest.raises(RuntimeError, match="fell due on the way"):
        sim.advance(1)


@pytest.mark.parametrize(
    ("seconds", "error"),
    [(-1, ValueError), (math.nan, ValueError), (math.inf, ValueError), (True, TypeError),
     ("1", TypeError), (None, TypeError)],
)  # fmt: skip
def test_absurd_advances_are_refused_naming_the_value(
    sim: SimulatedClock, seconds: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="advance"):
        sim.advance(seconds)  # type: ignore[arg-type]
    assert sim.elapsed == 0.0
