"""The limits' pure decision (:meth:`LimitPlanner.plan`) on a fake clock: run, hold or park."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from celery_extras.limits import planner as planner_module
from celery_extras.limits.planner import LimitPlanner
from celery_extras.limits.spec import LimitSpec, limit_id
from tests.support.clock import FakeClock

SETTINGS = {"delay_max_hold": 2.0, "limit_on_store_error": "local", "store_retry": 1.0}


def no_store() -> None:
    raise AssertionError("a worker-scope limit never asks the store")


@pytest.fixture
def planner_clock() -> tuple[LimitPlanner, FakeClock]:
    clock = FakeClock(30 * 86400.0)
    planner = LimitPlanner(SETTINGS, no_store, clock)  # type: ignore[arg-type]
    planner.register("t10", LimitSpec(10.0, 1, "worker", None, "10/s"))
    return planner, clock


REQUEST = SimpleNamespace(args=(), kwargs={})


def test_waits_up_to_the_hold_are_held_longer_ones_parked(
    planner_clock: tuple[LimitPlanner, FakeClock],
) -> None:
    planner, clock = planner_clock
    plans = [planner.plan("t10", REQUEST) for _ in range(23)]
    assert plans[0].action == "run"
    assert [p.action for p in plans[1:21]] == ["hold"] * 20  # waits 0.1 .. 2.0 s
    assert plans[20].wait == pytest.approx(2.0)
    assert [p.action for p in plans[21:]] == ["park", "park"]
    assert plans[22].due == pytest.approx(clock.now + 2.2)
    assert not any(p.verified for p in plans)


def test_a_verified_slot_is_kept_when_ahead_or_barely_passed(
    planner_clock: tuple[LimitPlanner, FakeClock],
) -> None:
    planner, clock = planner_clock
    planner.plan("t10", REQUEST)  # the bucket is busy now
    ahead = planner.plan("t10", REQUEST, slot=clock.now + 5.0)
    assert (ahead.action, ahead.wait, ahead.due, ahead.verified) == ("hold", 5.0, clock.now + 5.0,
                                                                     True)  # fmt: skip
    assert planner.plan("t10", REQUEST, slot=clock.now - 0.04).action == "run"  # tolerance 0.05 s
    missed = planner.plan("t10", REQUEST, slot=clock.now - 0.06)
    assert missed.action == "hold" and not missed.verified  # booked a new slot


def test_a_task_of_fixed_global_limits_names_its_calls_booked_ahead_without_reading_them() -> None:
    """Global, enforcing limits without a key and of a fixed cost: every call meets the
    same buckets at the same cost, so the key its calls booked ahead are kept under is
    known at registration, the one reading a call gives; any other limit reads each."""
    planner = LimitPlanner(SETTINGS, no_store)  # type: ignore[arg-type]
    fixed = (LimitSpec(100.0, 5, "global", None, "100/s", cost=2),
             LimitSpec(1000.0, 10, "global", None, "1000/s"))  # fmt: skip
    planner.register("fixed", fixed)
    read = planner_module._ahead_key("fixed", planner._calls("fixed", REQUEST))
    assert (
        planner._fixed["fixed"]
        == read
        == ("fixed", (limit_id("fixed", 0), "", 2), (limit_id("fixed", 1), "", 1))
    )
    for name, spec in {
        "worker": LimitSpec(10.0, 1, "worker", None, "10/s"),
        "keyed": LimitSpec(10.0, 1, "global", lambda a, k: a[0], "10/s"),
        "priced": LimitSpec(10.0, 5, "global", None, "10/s", cost=lambda a, k: len(a)),
        "shadow": LimitSpec(10.0, 1, "global", None, "10/s", shadow=True),
    }.items():
        planner.register(name, (fixed[1], spec))
        assert planner._fixed[name] is None, name
