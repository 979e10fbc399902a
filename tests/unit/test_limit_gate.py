"""The limit gate's decision for a task whose booked slot came round: go now, or book again.

The gate is driven through a real admission :class:`Pipeline` with a fake consumer. A fake
clock drives both the held path (the worker's timer fired) and the parked path (a slot the
delay store verified when the released message arrived). A slot used later than half its
interval (20 ms at least, 0.5 s at most) is booked again, so tasks delayed by an outage do
not all start together when it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from celery import Celery

import celery_extras
from celery_extras.admission import pipeline as pipeline_module
from celery_extras.admission.consumer import AdmittedConsumer
from celery_extras.admission.pipeline import Pipeline
from celery_extras.admission.registry import TaskPolicies
from celery_extras.bounds import MAX_WAIT
from celery_extras.delay.parking import Park
from celery_extras.limits.gate import LimitGate
from celery_extras.limits.planner import PARKED_PACE
from celery_extras.limits.rate import MIN_RATE
from celery_extras.limits.spec import LimitSpec
from celery_extras.signals import task_rate_limited
from tests.support import worker_state as worker_state_support
from tests.support.clock import FakeClock
from tests.support.fake_consumer import Consumer
from tests.support.fake_global import FakeGlobal

SETTINGS = {"delay_max_hold": 2.0, "limit_on_store_error": "local", "store_retry": 1.0}


class Request:
    """What the gate reads of Celery's request: id, args, eta and the message headers."""

    def __init__(self, eta: datetime | None = None, slot: str | None = None) -> None:
        self.id = f"r{id(self)}"
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.eta = eta.isoformat() if eta else None
        self.request_dict = {"extras_slot": slot} if slot else {}


def make_app(name: str) -> Celery:
    app = Celery(name, set_as_current=False)
    celery_extras.install(app)
    return app


def limited(spec: LimitSpec) -> TaskPolicies:
    return TaskPolicies(limits=(spec,))


def after_eta(pipeline: Pipeline, consumer: Any, request: Request, name: str) -> None:
    """The ETA of *request* passed: its strategy's consumer hands it to the pipeline."""
    AdmittedConsumer(consumer, pipeline, name).apply_eta_task(request)


@pytest.fixture
def limits() -> Iterator[tuple[Pipeline, LimitGate, FakeClock]]:
    clock = FakeClock()
    gate = LimitGate(make_app("unit-enforce"), SETTINGS, clock)
    pipeline = Pipeline([gate])
    pipeline.register("t10", limited(LimitSpec(10.0, 1, "worker", None, "10/s")))
    pipeline.register("t1000", limited(LimitSpec(1000.0, 1, "worker", None, "1000/s")))
    pipeline.register("t_half", limited(LimitSpec(0.5, 1, "worker", None, "30/m")))
    yield pipeline, gate, clock
    pipeline.stop()
    worker_state_support.clear()


def test_late_tolerance_is_half_an_interval_within_floor_and_cap(limits: Any) -> None:
    _pipeline, gate, _clock = limits
    planner = gate.planner
    assert planner.late_tolerance("t10") == pytest.approx(0.05)
    assert planner.late_tolerance("t1000") == pytest.approx(0.02)  # floor: timer jitter
    assert planner.late_tolerance("t_half") == pytest.approx(0.5)  # cap
    planner.set_limit("t10", "40/s")
    assert planner.late_tolerance("t10") == pytest.approx(0.02)  # a run-time rate counts


@pytest.mark.parametrize(("late", "runs"), [(0.0, True), (0.049, True), (0.051, False)])
def test_held_task_runs_only_if_its_timer_fired_within_the_tolerance(
    limits: Any, late: float, runs: bool
) -> None:
    pipeline, gate, clock = limits
    consumer, request = Consumer(), Request()
    bucket = gate.planner._local("t10", "", 10.0, 1)
    for _ in range(3):  # slots now, in 0.1 and 0.2 s: the request books the one in 0.3 s
        bucket.reserve()
    pipeline.submit(consumer, request, "t10")
    ((wait, due_call, args),) = consumer.scheduled
    assert wait == pytest.approx(0.3) and consumer.ran == [] and gate.counts["held"] == 1
    due = clock.now + 0.3
    clock.now = due + late
    bucket.reserve()  # the bucket is busy: booking again means waiting
    due_call(*args)  # the worker's timer fires
    if runs:
        assert consumer.ran == [request]
    else:  # booked again: the bucket hands out its next slot, a wait, and holds it again
        assert consumer.ran == []
        assert gate.counts["held"] == 2
    assert consumer.prefetch == (0 if runs else 1)  # widened while held, narrowed once due


class Arrival:
    """The delay store's arrival gate as the pipeline sees it: slots verified in the store."""

    def __init__(self) -> None:
        self.slots: dict[str, tuple[float, int | None, frozenset[int]]] = {}

    def pop_slot(self, task_id: str) -> tuple[float, int | None, frozenset[int]] | None:
        return self.slots.pop(task_id, None)


def gated_consumer(pipeline: Pipeline) -> tuple[Consumer, Arrival]:
    """A consumer whose pipeline is handed the delay store's arrival gate (as at its start)."""
    consumer, arrival = Consumer(), Arrival()
    pipeline.arrival = arrival
    return consumer, arrival


@pytest.mark.parametrize(("late", "runs"), [(0.0, True), (0.03, True), (0.2, False)])
def test_parked_task_keeps_its_verified_slot_only_if_on_time(
    limits: Any, late: float, runs: bool
) -> None:
    pipeline, gate, clock = limits
    consumer, arrival = gated_consumer(pipeline)
    gate.planner._local("t10", "", 10.0, 1).reserve()  # busy: booking again means waiting
    request = Request()
    arrival.slots[request.id] = (clock.now - late, 0, frozenset())
    after_eta(pipeline, consumer, request, "t10")
    assert (consumer.ran == [request]) is runs
    assert gate.counts["held"] == (0 if runs else 1)


def test_a_verified_slot_still_ahead_is_held_until_it_comes(limits: Any) -> None:
    pipeline, gate, clock = limits
    consumer, arrival = gated_consumer(pipeline)
    gate.planner._local("t10", "", 10.0, 1).reserve()
    request = Request()
    arrival.slots[request.id] = (clock.now + 0.7, 0, frozenset())
    pipeline.submit(consumer, request, "t10")
    assert consumer.ran == [] and (gate.counts["held"], gate.counts["slot_holds"]) == (0, 1)
    ((wait, due_call, args),) = consumer.scheduled
    assert wait == pytest.approx(0.7)
    clock.now += 0.7
    due_call(*args)
    assert consumer.ran == [request]


def test_slots_missed_in_an_outage_do_not_start_together(limits: Any) -> None:
    """Five parked tasks whose slots passed 0.1 to 0.5 s ago arrive at once after a
    reconnect: they book new slots one interval apart instead of all starting now."""
    pipeline, gate, clock = limits
    consumer, arrival = gated_consumer(pipeline)
    for i in range(5):
        request = Request()
        arrival.slots[request.id] = (clock.now - 0.1 * (i + 1), 0, frozenset())
        after_eta(pipeline, consumer, request, "t10")
    assert len(consumer.ran) == 1  # the first takes the free token, the rest wait in turn
    assert gate.counts["held"] == 4


def test_a_slot_header_books_nothing(limits: Any) -> None:
    """``extras_slot`` (the old hand-back header) is not trusted: only the store's word is."""
    pipeline, gate, _clock = limits
    consumer, _arrival = gated_consumer(pipeline)
    gate.planner._local("t10", "", 10.0, 1).reserve()
    after_eta(pipeline, consumer, Request(eta=datetime.now(UTC), slot="t10"), "t10")
    assert consumer.ran == []


@pytest.fixture
def global10(limits: Any) -> Any:
    pipeline, gate, clock = limits
    pipeline.register("g10", limited(LimitSpec(10.0, 2, "global", None, "10/s")))
    store = gate.planner._bucket = FakeGlobal(clock)
    return pipeline, gate, clock, store


def wait_of(planner: Any, name: str) -> tuple[float, bool]:
    """``(seconds to wait, slot booked)`` the planner gives a request of *name* arriving now."""
    plan = planner.plan(name, Request())
    return plan.wait, plan.booked


def busiest(times: list[float]) -> int:
    return max(sum(1 for s in times if t <= s < t + 1.0 - 1e-9) for t in times)


@pytest.mark.parametrize("outage_after", [0.0, 0.35, 1.0, 2.2])
def test_an_outage_adds_no_second_burst_to_booked_slots(global10: Any, outage_after: float) -> None:
    """Issue 17 item 5: slots booked on the store before an outage, the fallback bucket
    used during it and the store's slots after it, together, give at most rate + burst
    starts in any second per worker."""
    _pipeline, gate, clock, store = global10
    planner = gate.planner
    starts: list[float] = []
    for _ in range(8):  # 8 tasks arrive at once: 2 now, the rest booked 0.1 s apart
        wait, booked = wait_of(planner, "g10")
        assert booked
        starts.append(clock.now + wait)
    clock.now += outage_after
    store.error = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    for _ in range(40):  # arrivals go on through the outage, 20 a second
        wait, booked = wait_of(planner, "g10")
        assert booked
        starts.append(clock.now + wait)
        clock.now += 0.05
    assert busiest(sorted(starts)) <= 10 + 2
    clock.now += planner.store_retry
    store.error = None  # back, with a full bucket: the fallback's debt still comes first
    for _ in range(40):
        wait, booked = wait_of(planner, "g10")
        assert booked
        starts.append(clock.now + wait)
        clock.now += 0.05
    assert busiest(sorted(starts)) <= 10 + 2


def test_a_slot_handed_back_before_an_outage_books_on_the_fallback_bucket(global10: Any) -> None:
    pipeline, _gate, _clock, store = global10
    store.error = redis.ConnectionError("down")
    consumer = Consumer()
    for _ in range(3):
        pipeline.submit(consumer, Request(), "g10")  # 2 run (burst), 1 waits on the fallback
    late = Request(eta=datetime.now(UTC), slot="g10")  # on time, but booked on the store
    after_eta(pipeline, consumer, late, "g10")
    assert late not in consumer.ran  # the fallback bucket decides while the store is away


@pytest.mark.parametrize(("waits", "booked"), [(1e300, False), (float("nan"), False),
                                                (MAX_WAIT, True), (-5.0, True)])  # fmt: skip
def test_a_wait_beyond_the_longest_is_clamped_and_not_booked(
    global10: Any, waits: float, booked: bool
) -> None:
    _pipeline, gate, _clock, store = global10
    store.wait = waits
    wait, was_booked = wait_of(gate.planner, "g10")
    assert 0 <= wait <= MAX_WAIT and was_booked is booked


def test_a_worker_bucket_books_no_wait_beyond_the_longest(limits: Any) -> None:
    pipeline, gate, _clock = limits
    pipeline.register("slow", limited(LimitSpec(MIN_RATE, 1, "worker", None, "1/86400s")))
    planner = gate.planner
    plans = [planner.plan("slow", Request()) for _ in range(70)]
    assert (plans[0].action, plans[0].wait) == ("run", 0.0)
    # parked with no slot of the worker's own bucket booked, at the schedule of such parks
    # (at twice the rate: they come back to any worker)
    assert [(p.action, p.booked) for p in plans[1:]] == [("park", False)] * 69
    assert plans[30].wait == pytest.approx(30 * 86400.0 / PARKED_PACE)
    assert plans[60].wait == MAX_WAIT == plans[69].wait  # the schedule books no further


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        (redis.ConnectionError("Error 111"),  # unreachable: the process' one line
         "the store failed (ConnectionError: Error 111"),
        (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
         "global limits: the store failed (ResponseError: WRONGTYPE Operation"),
        (redis.ResponseError("x" * 100_000), "(100000 characters)"),
        (ValueError("a reply the script never gives"),
         "global limits: the store failed (ValueError: a reply"),
    ],
)  # fmt: skip
def test_store_errors_are_named_with_redis_text_once(
    global10: Any, caplog: pytest.LogCaptureFixture, error: Exception, logged: str
) -> None:
    _pipeline, gate, clock, store = global10
    planner = gate.planner
    store.error = error
    for _ in range(5):
        assert wait_of(planner, "g10")[1]  # the fallback books
        clock.now += planner.store_retry
    records = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(records) == 1 and logged in records[0], records
    assert "global limits: " in records[0]
    assert records[0].endswith(
        " they fall back to extras_limit_on_store_error='local' until it answers "
        "(logged once per outage)"
    )
    assert len(records[0]) < 600
    info = gate.info()
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
    limits: Any, rate: object, burst: object, error: str
) -> None:
    _pipeline, gate, _clock = limits
    with pytest.raises(ValueError) as info:
        gate.planner.set_limit("t10", rate, burst)
    assert error in str(info.value) and len(str(info.value)) < 200
    assert "t10" not in gate.planner.overrides


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

    def call_after(self, secs: float, fun: Any, args: tuple[Any, ...] = (), **kwargs: Any) -> Any:
        self.timers.append((self.clock.now + secs, fun, args))
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
    pipeline, _gate, clock, store = global10
    consumer = TimedConsumer(clock)
    store.error = redis.ConnectionError("Error 111: the master is gone")
    # no delay store on this consumer: every wait is held
    for _ in range(30):  # 2 run at once, 28 held on the fallback bucket, 0.1 s apart
        pipeline.submit(consumer, Request(), "g10")
    consumer.fire_until(clock.now + 1.2)  # past extras_limit_store_retry: the store is asked
    back = clock.now
    store.error = None  # promoted: a fresh bucket, full
    for _ in range(10):
        pipeline.submit(consumer, Request(), "g10")
    consumer.fire_until(clock.now + 10.0)
    assert not consumer.timers and len(consumer.started) == 40  # all ran, none lost
    after = sorted(t for t in consumer.started if t >= back)
    assert busiest(after) <= 10 + 2


def test_a_fallback_slot_is_not_parked_as_booked(
    global10: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot of the fallback bucket (store away) is unknown to the store: the task is held,
    and books again on the store if it answers before the slot comes; it is never parked
    with that slot."""
    pipeline, gate, clock, store = global10
    store.error = redis.ConnectionError("down")
    parked: list[float] = []

    def park(arrival: Any, request: Any, name: str, kind: str, delay: float) -> tuple[Park, str]:
        parked.append(delay)
        return Park.PARKED, "entry"

    monkeypatch.setattr(pipeline_module, "park_message", park)
    consumer, _arrival = gated_consumer(pipeline)
    for _ in range(40):  # waits beyond extras_limit_max_hold would be parked
        pipeline.submit(consumer, Request(), "g10")
    assert parked == []
    assert (len(consumer.ran), gate.counts["held"]) == (2, 38)  # burst 2, then every one held
    # (and the same consumer parks a wait booked on the store once it answers)
    store.error = None
    clock.now += gate.planner.store_retry
    pipeline.submit(consumer, Request(), "g10")
    assert len(parked) == 1 and gate.counts["parked"] == 1


def test_a_park_left_in_doubt_is_parked_again_never_run_here_seed_2(
    global10: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A park whose reply the store lost (a timeout: it may hold the message) is neither run
    here nor asked of the gate again: the message is held and parked again every
    ``PARK_AGAIN`` s, through a store that refuses connections meanwhile, until a park says
    it is stored (found by the chaos checker, seed 2: an ETA message ran here and from the
    store)."""
    pipeline, _gate, clock, _store = global10
    consumer = TimedConsumer(clock)
    pipeline.arrival = Arrival()
    asked: list[str] = []
    doubted: dict[str, list[Park]] = {}

    def park(arrival: Any, request: Any, name: str, kind: str, delay: float) -> tuple[Park, str]:
        asked.append(request.id)
        if not doubted:
            doubted[request.id] = [Park.KEPT, Park.PARKED]  # refused, then stored
            return Park.IN_DOUBT, "entry"
        return doubted[request.id].pop(0) if request.id in doubted else Park.PARKED, "entry"

    monkeypatch.setattr(pipeline_module, "park_message", park)
    requests = [Request() for _ in range(30)]
    for request in requests:  # 2 run, the next held, those waiting beyond 2 s parked
        pipeline.submit(consumer, request, "g10")
    (doubt,) = doubted
    assert asked.count(doubt) == 1
    consumer.fire_until(clock.now + 1.0)  # held PARK_AGAIN s, parked again: refused
    assert asked.count(doubt) == 2
    consumer.fire_until(clock.now + 1.0)  # and again: stored
    assert asked.count(doubt) == 3
    consumer.fire_until(clock.now + 60.0)
    assert asked.count(doubt) == 3  # settled: neither parked nor asked again
    parked = set(asked)
    ran = {r.id for r in consumer.ran}
    assert doubt not in ran and not ran & parked and len(ran | parked) == 30


def test_an_eta_timer_of_a_lost_connection_runs_nothing(limits: Any) -> None:
    """Celery 5.5/5.6 keep ETA timers of a lost connection; the broker delivers those
    messages again, so the admitted consumer of the old connection drops them."""
    pipeline, _gate, _clock = limits
    consumer = Consumer()
    old = AdmittedConsumer(consumer, pipeline, "t10")
    pipeline.stop()  # the connection is lost; Celery builds new strategies on the next one
    new = AdmittedConsumer(consumer, pipeline, "t10")
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
    from celery_extras.limits import gate as limit_gate
    from celery_extras.limits.redis_bucket import Override

    limit_gate._announced.clear()
    gate = LimitGate(make_app("unit-announce"), SETTINGS, FakeClock())
    pipeline = Pipeline([gate])
    policies = limited(LimitSpec(5.0, 1, "global", None, "5/s"))
    if registered_first:
        pipeline.register("t5", policies)
    gate.planner.overrides["t5"] = Override(7.0, None, "7/s")  # as load_overrides() reads it
    gate.announce(*gate.planner.overrides)
    pipeline.register("t5", policies)  # (again, when registered first: a consumer restart)
    gate.announce(*gate.planner.overrides)
    lines = [r.getMessage() for r in caplog.records if "stored rate" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("celery-extras: t5 runs at the stored rate "
                                                   "7/s, not its limit() 5/s")  # fmt: skip
    limit_gate._announced.clear()


def test_a_parked_wait_ends_at_its_booked_slot_whatever_time_passed_before_parking(
    limits: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Time spent between booking and parking (a slow ``task_rate_limited`` receiver, the
    message built for the store) is taken off the parked wait: a parked task is not later
    than its slot, which would crowd the slots booked after it."""
    pipeline, gate, clock = limits
    pipeline.register("g_half", limited(LimitSpec(0.5, 1, "global", None, "30/m")))
    store = gate.planner._bucket = FakeGlobal(clock)
    stored: list[float] = []

    def park(arrival: Any, request: Any, name: str, kind: str, delay: float) -> tuple[Park, str]:
        stored.append(clock.now + delay)
        return Park.PARKED, "entry"

    def slow_receiver(sender: Any = None, **kwargs: Any) -> None:
        clock.now += 0.5

    monkeypatch.setattr(pipeline_module, "park_message", park)
    task_rate_limited.connect(slow_receiver, weak=False)
    try:
        consumer, _arrival = gated_consumer(pipeline)
        for _ in range(8):
            pipeline.submit(consumer, Request(), "g_half")  # 30/m: one slot every 2 s
    finally:
        task_rate_limited.disconnect(slow_receiver)
    booked = store.buckets[("g_half", "")].booked_until()
    assert gate.counts["parked"] == len(stored) == 6  # 1 runs, the 2 s wait is held
    assert stored == [booked - 2.0 * n for n in range(5, -1, -1)]
