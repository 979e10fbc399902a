"""Several limits in simulated time (the users' plugin, on the project's own tests): exact
figures, with no timing noise, in a fraction of a second.

A task parked by one limit keeps the tokens it booked in the others at arrival (its
entry's kind names them): distinct keys under a global limit get the global rate.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, shared_task
from celery.worker import state

from celery_extras import SimulatedClock, delayed, limit


@limit("20/s")  # the API's quota, for everyone
@limit("4/s", key=lambda args, kwargs: args[0])  # and each customer's
@shared_task(name="tests.simulated.api_call")
def api_call(customer: str, i: int) -> int:
    return i


def ready(results: list[Any]) -> int:
    return sum(r.ready() for r in results)


class LeftBehind:
    """A request of another app in Celery's reserved requests (one set per process)."""

    app = Celery("another", set_as_current=False)
    id = "left-behind"


def test_a_request_of_another_worker_in_the_process_is_not_waited_for(
    extras_worker: Any, extras_clock: SimulatedClock
) -> None:
    """An earlier test's in-process worker, stopped with a request reserved, leaves it in
    Celery's per-process set: this worker settles all the same (it waited 30 s, then
    failed with "1 task(s) reserved", seen once in CI on Celery 5.5)."""
    other = LeftBehind()
    state.reserved_requests.add(other)
    try:
        call = api_call.delay("acme", 1)
        extras_clock.advance(0)
        assert call.ready()
    finally:
        state.reserved_requests.discard(other)


def test_distinct_keys_get_the_global_rate(
    extras_worker: Any, extras_clock: SimulatedClock
) -> None:
    """Each call books its key's token at arrival and waits for the global one: released,
    it is not asked for its key's token again (it used to wait for its key's next slot,
    0.25 s: 3 calls in 0.3 s instead of 7)."""
    calls = [api_call.delay(f"customer-{i}", i) for i in range(8)]
    extras_clock.advance(0)
    assert ready(calls) == 1
    extras_clock.advance(0.3)
    assert ready(calls) == 7  # at 0, 0.05, ... 0.3 s
    extras_clock.advance(0.05)
    assert ready(calls) == 8


def test_one_key_gets_its_own_rate(extras_worker: Any, extras_clock: SimulatedClock) -> None:
    calls = [api_call.delay("acme", i) for i in range(8)]
    extras_clock.advance(0)
    assert ready(calls) == 1
    extras_clock.advance(1.0)
    assert ready(calls) == 5  # at 0, 0.25, 0.5, 0.75 and 1.0 s
    extras_clock.advance(0.75)
    assert ready(calls) == 8


@pytest.mark.celery(extras_delay_shards=4)
def test_a_sharded_store_releases_every_parked_wait_in_time(
    extras_worker: Any, extras_clock: SimulatedClock
) -> None:
    """The same figures with the store in 4 shards: the settling worker finds the next due
    entry in any shard, and sees each released one taken where it was claimed."""
    calls = [api_call.delay(f"customer-{i}", i) for i in range(8)]
    extras_clock.advance(0)
    assert ready(calls) == 1
    extras_clock.advance(0.3)
    assert ready(calls) == 7
    extras_clock.advance(0.05)
    assert ready(calls) == 8
    assert delayed(extras_worker.app)["shards"] == {"0": 0, **{f"4.{i}": 0 for i in range(4)}}
