"""The enforcer's decision for a task whose booked slot came round: go now, or book again.

A fake clock drives both the held path (the worker's timer fired) and the parked path
(a slot the delay store verified when the released message arrived). A slot used later
than half its interval (20 ms at least, 0.5 s at most) is booked again, so tasks delayed
by an outage do not all start together when it ends.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from celery import Celery
from celery.worker import state as worker_state

from celery_extras.bounds import MAX_WAIT
from celery_extras.limits.gate import Enforcer, GatedConsumer
from celery_extras.limits.rate import MIN_RATE
from celery_extras.limits.spec import LimitSpec
from celery_extras.limits.token_bucket import TokenBucket
from tests.support.clock import FakeClock

SETTINGS = {"limit_max_hold": 2.0, "limit_on_store_error": "local", "limit_store_retry": 1.0}


class Request:
    """What the enforcer reads of Celery's request: id, args, eta and the message headers."""

    def __init__(self, eta: datetime | None = None, slot: str | None = None) -> None:
        self.id = f"r{id(self)}"
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.eta = eta.isoformat() if eta else None
        self.request_dict = {"extras_slot": slot} if slot else {}


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


class Gate:
    """The delay store's arrival gate as the enforcer sees it: slots verified in the store."""

    def __init__(self) -> None:
        self.slots: dict[str, float] = {}

    def pop_slot(self, task_id: str) -> float | None:
        return self.slots.pop(task_id, None)


def gated_consumer() -> tuple[Consumer, Gate]:
    consumer, gate = Consumer(), Gate()
    consumer.extras_delay = gate  # type: ignore[attr-defined]
    return consumer, gate


@pytest.mark.parametrize(("late", "runs"), [(0.0, True), (0.03, True), (0.2, False)])
def test_parked_task_keeps_its_verified_slot_only_if_on_time(
    enforcer: Any, late: float, runs: bool
) -> None:
    e, clock = enforcer
    consumer, gate = gated_consumer()
    e._local("t10", "", 10.0, 1).reserve()  # the bucket is busy: booking again means waiting
    request = Request()
    gate.slots[request.id] = clock.now - late
    e.after_eta(consumer, request, "t10")
    assert (consumer.ran == [request]) is runs
    assert e.counts["held"] == (0 if runs else 1)


def test_a_verified_slot_still_ahead_is_held_until_it_comes(enforcer: Any) -> None:
    e, clock = enforcer
    consumer, gate = gated_consumer()
    e._local("t10", "", 10.0, 1).reserve()
    request = Request()
    gate.slots[request.id] = clock.now + 0.7
    e.submit(consumer, request, "t10")
    assert consumer.ran == [] and (e.counts["held"], e.counts["slot_holds"]) == (0, 1)
    clock.now += 0.7
    e._release(consumer, request, "t10", True, clock.now)
    assert consumer.ran == [request]


def test_slots_missed_in_an_outage_do_not_start_together(enforcer: Any) -> None:
    """Five parked tasks whose slots passed 0.1 to 0.5 s ago arrive at once after a
    reconnect: they book new slots one interval apart instead of all starting now."""
    e, clock = enforcer
    consumer, gate = gated_consumer()
    for i in range(5):
        request = Request()
        gate.slots[request.id] = clock.now - 0.1 * (i + 1)
        e.after_eta(consumer, request, "t10")
    assert len(consumer.ran) == 1  # the first takes the free token, the rest wait in turn
    assert e.counts["held"] == 4


def test_a_slot_header_books_nothing(enforcer: Any) -> None:
    """``extras_slot`` (the old hand-back header) is not trusted: only the store's word is."""
    e, _clock = enforcer
    consumer, _gate = gated_consumer()
    e._local("t10", "", 10.0, 1).reserve()
    e.after_eta(consumer, Request(eta=datetime.now(UTC), slot="t10"), "t10")
    assert consumer.ran == []


class FakeGlobal:
    """A global bucket on the fake clock (the same GCRA as Redis'), or a failing store."""

    def __init__(self, clock: FakeClock, rate: float, burst: int) -> None:
        self.bucket = TokenBucket(rate, burst, clock)
        self.error: Exception | None = None
        self.wait: float | None = None

    def reserve(self, name: str, rate: float, burst: int, key: str = "") -> float:
        if self.error is not None:
            raise self.error
        if self.wait is not None:
            return self.wait
        return self.bucket.reserve(max_wait=MAX_WAIT)

    def report_ignored(self, name: str, reason: str) -> None:
        pass


@pytest.fixture
def global10(enforcer: Any) -> Any:
    e, clock = enforcer
    e.register("g10", LimitSpec(10.0, 2, "global", None, "10/s"))
    store = e._bucket = FakeGlobal(clock, 10.0, 2)
    return e, clock, store


def busiest(times: list[float]) -> int:
    return max(sum(1 for s in times if t <= s < t + 1.0 - 1e-9) for t in times)


@pytest.mark.parametrize("outage_after", [0.0, 0.35, 1.0, 2.2])
def test_an_outage_adds_no_second_burst_to_booked_slots(global10: Any, outage_after: float) -> None:
    """Issue 17 item 5: slots booked on the store before an outage, the fallback bucket
    used during it and the store's slots after it, together, give at most rate + burst
    starts in any second per worker."""
    e, clock, store = global10
    starts: list[float] = []
    for _ in range(8):  # 8 tasks arrive at once: 2 now, the rest booked 0.1 s apart
        wait, booked = e.wait_for("g10", e.specs["g10"], Request())
        assert booked
        starts.append(clock.now + wait)
    clock.now += outage_after
    store.error = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    for _ in range(40):  # arrivals go on through the outage, 20 a second
        wait, booked = e.wait_for("g10", e.specs["g10"], Request())
        assert booked
        starts.append(clock.now + wait)
        clock.now += 0.05
    assert busiest(sorted(starts)) <= 10 + 2
    clock.now += e.store_retry
    store.error = None  # back, with a full bucket: the fallback's debt still comes first
    for _ in range(40):
        wait, booked = e.wait_for("g10", e.specs["g10"], Request())
        assert booked
        starts.append(clock.now + wait)
        clock.now += 0.05
    assert busiest(sorted(starts)) <= 10 + 2


def test_a_slot_handed_back_before_an_outage_books_on_the_fallback_bucket(global10: Any) -> None:
    e, _clock, store = global10
    store.error = redis.ConnectionError("down")
    consumer = Consumer()
    for _ in range(3):
        e.submit(consumer, Request(), "g10")  # 2 run (burst), 1 waits on the fallback
    late = Request(eta=datetime.now(UTC), slot="g10")  # on time, but booked on the store
    e.after_eta(consumer, late, "g10")
    assert late not in consumer.ran  # the fallback bucket decides while the store is away


@pytest.mark.parametrize(("waits", "booked"), [(1e300, False), (float("nan"), False),
                                                (MAX_WAIT, True), (-5.0, True)])  # fmt: skip
def test_a_wait_beyond_the_longest_is_clamped_and_not_booked(
    global10: Any, waits: float, booked: bool
) -> None:
    e, _clock, store = global10
    store.wait = waits
    wait, was_booked = e.wait_for("g10", e.specs["g10"], Request())
    assert 0 <= wait <= MAX_WAIT and was_booked is booked


def test_a_worker_bucket_books_no_wait_beyond_the_longest(enforcer: Any) -> None:
    e, _clock = enforcer
    e.register("slow", LimitSpec(MIN_RATE, 1, "worker", None, "1/86400s"))
    waits = [e.wait_for("slow", e.specs["slow"], Request()) for _ in range(40)]
    assert waits[0] == (0.0, True)
    assert waits[30] == (pytest.approx(30 * 86400.0), True)
    assert waits[31] == (MAX_WAIT, False) == waits[39]  # not booked: asks again later


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        (redis.ConnectionError("Error 111"), "the store is unreachable (ConnectionError: Error"),
        (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
         "answered the limit script with an error (ResponseError: WRONGTYPE Operation"),
        (redis.ResponseError("x" * 100_000), "(100000 characters)"),
        (ValueError("a reply the script never gives"), "with an error (ValueError: a reply"),
    ],
)  # fmt: skip
def test_store_errors_are_named_with_redis_text_once(
    global10: Any, caplog: pytest.LogCaptureFixture, error: Exception, logged: str
) -> None:
    e, clock, store = global10
    store.error = error
    for _ in range(5):
        assert e.wait_for("g10", e.specs["g10"], Request())[1]  # the fallback books
        clock.now += e.store_retry
    records = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(records) == 1 and logged in records[0], records
    assert len(records[0]) < 600
    info = e.info()
    assert info["store"] == "down" and logged.split("(")[-1] in f"({info['store_error']}"


@pytest.mark.parametrize(
    ("rate", "burst", "error"),
    [("1e-300/s", None, "rate '1e-300/s': must be between"),
     ("1e308/s", None, "rate '1e308/s': must be between"),
     ("10/s", 10**30, "burst 1000000000000000000000000000000: expected an integer from 1"),
     ("10/s", True, "burst True"), ("x" * 10**6, None, "(1000002 characters)"),
     (["10/s"], None, "rate ['10/s']: expected a string")],
)  # fmt: skip
def test_set_limit_refuses_rates_and_bursts_out_of_bounds(
    enforcer: Any, rate: object, burst: object, error: str
) -> None:
    e, _clock = enforcer
    with pytest.raises(ValueError) as info:
        e.set_limit("t10", rate, burst)
    assert error in str(info.value) and len(str(info.value)) < 200
    assert "t10" not in e.overrides


class TimedConsumer(Consumer):
    """A consumer whose timer entries the test fires in order, on the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.timers: list[tuple[float, Any, tuple[Any, ...]]] = []
        self.started: list[float] = []

    def on_task_request(self, request: Request) -> None:
        super().on_task_request(request)
        self.started.append(self.clock.now)

    def call_after(self, wait: float, fn: Any, args: tuple[Any, ...], **kwargs: Any) -> Any:
        self.timers.append((self.clock.now + wait, fn, args))
        return self

    def fire_until(self, until: float) -> None:
        while self.timers:
            self.timers.sort(key=lambda t: t[0])
            if self.timers[0][0] > until:
                break
            due, fn, args = self.timers.pop(0)
            self.clock.now = max(self.clock.now, due)
            fn(*args)
        self.clock.now = max(self.clock.now, until)


def test_fallback_slots_are_booked_again_on_the_store_once_it_answers(global10: Any) -> None:
    """A failover: slots booked on the fallback bucket while the store was away are unknown
    to the (new) store, whose bucket starts full. Held tasks whose fallback slot comes after
    the store answers again book a slot there instead, so the limit holds from then on."""
    e, clock, store = global10
    consumer = TimedConsumer(clock)
    store.error = redis.ConnectionError("Error 111: the master is gone")
    # no delay store on this consumer: every wait is held
    for _ in range(30):  # 2 run at once, 28 held on the fallback bucket, 0.1 s apart
        e.submit(consumer, Request(), "g10")
    consumer.fire_until(clock.now + 1.2)  # past extras_limit_store_retry: the store is asked
    back = clock.now
    store.error = None  # promoted: a fresh bucket, full
    for _ in range(10):
        e.submit(consumer, Request(), "g10")
    consumer.fire_until(clock.now + 10.0)
    assert not consumer.timers and len(consumer.started) == 40  # all ran, none lost
    after = sorted(t for t in consumer.started if t >= back)
    assert busiest(after) <= 10 + 2


def test_a_fallback_slot_is_not_parked_as_booked(global10: Any) -> None:
    """A slot of the fallback bucket (store away) is unknown to the store: the task is held,
    and books again on the store if it answers before the slot comes; it is never parked
    with that slot."""
    e, _clock, store = global10
    store.error = redis.ConnectionError("down")
    parked: list[float] = []
    e.park = lambda gate, request, name, slot: parked.append(slot) or True  # type: ignore[method-assign]
    consumer, _gate = gated_consumer()
    for _ in range(40):  # waits beyond extras_limit_max_hold would be parked
        e.submit(consumer, Request(), "g10")
    assert parked == []
    assert (len(consumer.ran), e.counts["held"]) == (2, 38)  # burst 2, then every one held


def test_an_eta_timer_of_a_lost_connection_runs_nothing(enforcer: Any) -> None:
    """Celery 5.5/5.6 keep ETA timers of a lost connection; the broker delivers those
    messages again, so the gated consumer of the old connection drops them."""
    e, _clock = enforcer
    consumer = Consumer()
    old = GatedConsumer(consumer, e, "t10")
    e.stop()  # the connection is lost; Celery builds new strategies on the next one
    new = GatedConsumer(consumer, e, "t10")
    on_time = datetime.now(UTC)
    old.apply_eta_task(Request(eta=on_time, slot="t10"))
    assert consumer.ran == []
    request = Request(eta=on_time, slot="t10")
    new.apply_eta_task(request)
    assert consumer.ran == [request]


@pytest.mark.parametrize("registered_first", [True, False])
def test_a_stored_rate_is_announced_once_whichever_starts_first(
    registered_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Celery orders the consumer's Tasks step and ours either way: the task's strategy
    (which registers its limit) may be built before or after the stored rates load."""
    from celery_extras.limits import gate as enforce
    from celery_extras.limits.redis_bucket import Override

    enforce._announced.clear()
    enforcer = Enforcer(Celery("unit-announce", set_as_current=False), SETTINGS, FakeClock())
    spec = LimitSpec(5.0, 1, "global", None, "5/s")
    if registered_first:
        enforcer.register("t5", spec)
    enforcer.overrides["t5"] = Override(7.0, None, "7/s")  # as load_overrides() reads it
    enforcer.announce(*enforcer.overrides)
    enforcer.register("t5", spec)  # (again, when registered first: a consumer restart)
    enforcer.announce(*enforcer.overrides)
    lines = [r.getMessage() for r in caplog.records if "stored rate" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("celery-extras: t5 runs at the stored rate "
                                                   "7/s, not its limit() 5/s")  # fmt: skip
    enforce._announced.clear()
