"""The enforcer's decision for a task whose booked slot came round: go now, or book again.

A fake clock drives the held path (the worker's timer fired) and the wall clock the
handed-back path (the message's ETA passed). A slot used later than half its interval
(20 ms at least, 0.5 s at most) is booked again, so tasks delayed by an outage do not
all start together when it ends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from celery.worker import state as worker_state

from celery_extras.policies.enforce import SLOT_HEADER, Enforcer
from celery_extras.policies.spec import LimitSpec
from tests.support.clock import FakeClock

SETTINGS = {"limit_max_hold": 2.0, "limit_on_store_error": "local", "limit_store_retry": 1.0}


class Request:
    """What the enforcer reads of Celery's request: id, args, eta and the message headers."""

    def __init__(self, eta: datetime | None = None, slot: str | None = None) -> None:
        self.id = f"r{id(self)}"
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.eta = eta.isoformat() if eta else None
        self.request_dict = {SLOT_HEADER: slot} if slot else {}


class Consumer:
    """Records which requests went to the pool; a timer that never fires by itself."""

    def __init__(self) -> None:
        self.ran: list[Request] = []
        self.timer = self
        self.qos = self

    def on_task_request(self, request: Request) -> None:
        self.ran.append(request)

    def call_after(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def cancel(self) -> None:
        pass

    def increment_eventually(self) -> None:
        pass

    def decrement_eventually(self) -> None:
        pass


@pytest.fixture
def enforcer() -> Any:
    clock = FakeClock()
    enforcer = Enforcer(Celery("unit-enforce", set_as_current=False), SETTINGS, clock)
    enforcer.register("t10", LimitSpec(10.0, 1, "worker", None, "10/s"))
    enforcer.register("t1000", LimitSpec(1000.0, 1, "worker", None, "1000/s"))
    enforcer.register("t_half", LimitSpec(0.5, 1, "worker", None, "30/m"))
    yield enforcer, clock
    enforcer.stop()
    worker_state.requests.clear()
    worker_state.reserved_requests.clear()


def test_late_tolerance_is_half_an_interval_within_floor_and_cap(enforcer: Any) -> None:
    e, _clock = enforcer
    assert e.late_tolerance("t10") == pytest.approx(0.05)
    assert e.late_tolerance("t1000") == pytest.approx(0.02)  # floor: timer jitter
    assert e.late_tolerance("t_half") == pytest.approx(0.5)  # cap
    e.set_limit("t10", "40/s")
    assert e.late_tolerance("t10") == pytest.approx(0.02)  # a run-time rate counts


@pytest.mark.parametrize(("late", "runs"), [(0.0, True), (0.049, True), (0.051, False)])
def test_held_task_runs_only_if_its_timer_fired_within_the_tolerance(
    enforcer: Any, late: float, runs: bool
) -> None:
    e, clock = enforcer
    consumer, request = Consumer(), Request()
    e.hold(consumer, request, "t10", 0.3, booked=True)
    due = clock.now + 0.3
    clock.now = due + late
    e._local("t10", "", 10.0, 1).reserve()  # the bucket is busy: booking again means waiting
    e._release(consumer, request, "t10", True, due)
    if runs:
        assert consumer.ran == [request]
    else:  # booked again: the bucket hands out its next slot, a wait, and holds it again
        assert consumer.ran == []
        assert e.counts["held"] == 2


@pytest.mark.parametrize(("late", "runs"), [(0.0, True), (0.03, True), (0.2, False)])
def test_handed_back_task_keeps_its_slot_only_if_on_time(
    enforcer: Any, late: float, runs: bool
) -> None:
    e, _clock = enforcer
    consumer = Consumer()
    e._local("t10", "", 10.0, 1).reserve()  # the bucket is busy: booking again means waiting
    request = Request(eta=datetime.now(UTC) - timedelta(seconds=late), slot="t10")
    e.after_eta(consumer, request, "t10")
    assert (consumer.ran == [request]) is runs
    assert e.counts["held"] == (0 if runs else 1)


def test_slots_missed_in_an_outage_do_not_start_together(enforcer: Any) -> None:
    """Five handed-back tasks whose slots passed 0.1 to 0.5 s ago arrive at once after a
    reconnect: they book new slots one interval apart instead of all starting now."""
    e, _clock = enforcer
    consumer = Consumer()
    now = datetime.now(UTC)
    for i in range(5):
        request = Request(eta=now - timedelta(seconds=0.1 * (i + 1)), slot="t10")
        e.after_eta(consumer, request, "t10")
    assert len(consumer.ran) == 1  # the first takes the free token, the rest wait in turn
    assert e.counts["held"] == 4


def test_a_slot_header_of_another_task_books_a_slot(enforcer: Any) -> None:
    e, _clock = enforcer
    consumer = Consumer()
    e._local("t10", "", 10.0, 1).reserve()
    e.after_eta(consumer, Request(eta=datetime.now(UTC), slot="other"), "t10")
    assert consumer.ran == []
