"""The admission pipeline with two small scripted gates and a fake consumer (no worker).

The gates are asked in order; a :class:`Hold` waits in the consumer's timer (or is parked)
and asks the same gate again, :data:`QUEUED` waits in the gate until it resumes the
ticket; the prefetch window is widened while a request waits and narrowed once when it
goes on. Endings reach the gates that hear them, once, through the request hook or the
tick that finds a request Celery forgot.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state as worker_state
from celery.worker.request import Request

from celery_extras import compat
from celery_extras.admission.gate import (
    COVERED,
    QUEUED,
    RUN,
    Answer,
    Gate,
    Hold,
    HolderIds,
    Ticket,
)
from celery_extras.admission.handle import GateHandle
from celery_extras.admission.notices import bucket_tag
from celery_extras.admission.pipeline import TICK, Pipeline
from celery_extras.admission.request_hook import request_hook
from tests.support import worker_state as worker_state_support
from tests.support.worker_state import TRACKS_HELD


class TaskRequest(Request):
    """A Celery request without a message; its callbacks note their calls."""

    def __init__(self, task_id: str, name: str = "t") -> None:
        self.id = task_id
        self.name = name
        self.calls: list[str] = []
        self.acked = 0
        self._message = SimpleNamespace(headers={"task": name, "id": task_id})

    def on_accepted(self, pid: Any, time_accepted: Any) -> None:
        self.calls.append("accepted")

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> None:
        self.calls.append("success")
        if failed__retval__runtime[0]:  # as Celery's: a failure goes on to on_failure
            self.on_failure(failed__retval__runtime[1], return_ok=True)

    def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> None:
        self.calls.append("failure")

    def acknowledge(self) -> None:
        self.acked += 1


class Scripted(Gate):
    """A gate answering what the test scripted (then :data:`RUN`), noting what it heard."""

    label = "scripted"

    def __init__(self, asked: list[tuple[str, Any]]) -> None:
        self.asked = asked  # shared by both gates: the order they were asked in
        self.answers: list[Answer] = []
        self.names: set[str] = set()
        self.held_calls: list[tuple[Any, Hold, bool]] = []
        self.queued: list[Ticket] = []
        self.ended: list[Any] = []
        self.started: list[tuple[Any, Any]] = []
        self.ticks = 0
        self.stops = 0
        self.retries_heard: list[float | None] = []
        self.yields: list[tuple[Any, float]] = []

    def handles(self, name: str) -> bool:
        return name in self.names

    def register(self, name: str, policies: Any) -> None:
        if self.label in policies:
            self.names.add(name)

    def start(self, handle: Any, consumer: Any) -> None:
        self.started.append((handle, consumer))

    def admit(self, ticket: Ticket) -> Answer:
        self.asked.append((self.label, ticket.request))
        answer = self.answers.pop(0) if self.answers else RUN
        if answer is QUEUED:
            self.queued.append(ticket)
        return answer

    def held(self, ticket: Ticket, answer: Hold, parked: bool) -> None:
        self.held_calls.append((ticket.request, answer, parked))

    def finished(self, ticket: Ticket) -> None:
        self.ended.append(ticket.request)
        self.retries_heard.append(ticket.retry_in)

    def yielded(self, ticket: Ticket, seconds: float) -> None:
        self.yields.append((ticket.request, seconds))

    def tick(self) -> None:
        self.ticks += 1

    def stop(self) -> None:
        self.stops += 1


class RateGate(Scripted):
    """First gate; hears no endings (as the limit gate)."""

    label = "rate"


class SlotsGate(Scripted):
    """Second gate; hears every ending of what it let through (as the slot gate)."""

    label = "slots"
    hears_endings = True


class Entry:
    def __init__(self, secs: float, fun: Any, args: tuple[Any, ...]) -> None:
        self.secs, self.fun, self.args = secs, fun, args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Consumer:
    """A consumer whose timer entries the test fires, and whose prefetch changes are counted."""

    def __init__(self) -> None:
        self.ran: list[Any] = []
        self.reserved_when_run: list[bool] = []
        self.timer = self
        self.qos = self
        self.widened = 0
        self.narrowed = 0
        self.entries: list[Entry] = []
        self.repeating: list[Entry] = []

    def on_task_request(self, request: Any) -> None:
        self.reserved_when_run.append(compat.request_pending(request))
        self.ran.append(request)

    def call_after(self, secs: float, fun: Any, args: tuple[Any, ...] = (), **kw: Any) -> Entry:
        entry = Entry(secs, fun, args)
        self.entries.append(entry)
        return entry

    def call_repeatedly(self, secs: float, fun: Any, args: tuple[Any, ...] = (),
                        **kw: Any) -> Entry:  # fmt: skip
        entry = Entry(secs, fun, args)
        self.repeating.append(entry)
        return entry

    def fire(self, entry: Entry) -> None:
        entry.fun(*entry.args)

    def increment_eventually(self) -> None:
        self.widened += 1

    def decrement_eventually(self) -> None:
        self.narrowed += 1


BOTH = {"rate", "slots"}


@pytest.fixture
def asked() -> list[tuple[str, Any]]:
    return []


@pytest.fixture
def gates(asked: list[tuple[str, Any]]) -> tuple[RateGate, SlotsGate]:
    return RateGate(asked), SlotsGate(asked)


@pytest.fixture
def pipeline(gates: tuple[RateGate, SlotsGate]) -> Iterator[Pipeline]:
    pipeline = Pipeline(gates)
    assert pipeline.register("t", BOTH)
    yield pipeline
    pipeline.stop()
    worker_state_support.clear()


def test_gates_are_asked_in_order_then_the_request_is_reserved_and_run(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], asked: list[tuple[str, Any]]
) -> None:
    rate, slots = gates
    assert pipeline.register("rate_only", {"rate"}) and pipeline.register("slots_only", {"slots"})
    assert not pipeline.register("plain", set())  # no gate handles it: Celery's own strategy
    assert pipeline.chains == {"t": (rate, slots), "rate_only": (rate,), "slots_only": (slots,),
                               "plain": ()}  # fmt: skip
    assert pipeline.gate("slots") is slots
    consumer = Consumer()
    first, second, third = TaskRequest("1"), TaskRequest("2"), TaskRequest("3", "slots_only")
    pipeline.submit(consumer, first, "t")
    pipeline.submit(consumer, second, "rate_only")
    pipeline.submit(consumer, third, "slots_only")
    assert asked == [("rate", first), ("slots", first), ("rate", second), ("slots", third)]
    assert consumer.ran == [first, second, third]
    assert consumer.reserved_when_run == [True, True, True]  # reserved before the pool has it
    assert (consumer.widened, consumer.narrowed, consumer.entries) == (0, 0, [])


def test_the_gate_order_is_the_pipelines(asked: list[tuple[str, Any]]) -> None:
    rate, slots = RateGate(asked), SlotsGate(asked)
    pipeline = Pipeline([slots, rate])
    pipeline.register("t", BOTH)
    request = TaskRequest("1")
    pipeline.submit(Consumer(), request, "t")
    assert asked == [("slots", request), ("rate", request)]
    worker_state.requests.clear()
    worker_state.reserved_requests.clear()


def test_a_hold_waits_in_the_timer_then_asks_the_same_gate_again(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], asked: list[tuple[str, Any]]
) -> None:
    _rate, slots = gates
    slots.answers = [Hold(0.5), Hold(0.25)]  # twice: not yet, then not yet again
    consumer, request = Consumer(), TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    assert consumer.ran == [] and len(pipeline.holds) == 1
    assert [e.secs for e in consumer.entries] == [0.5]
    assert slots.held_calls == [(request, Hold(0.5), False)]
    assert (consumer.widened, consumer.narrowed) == (1, 0)  # widened while it waits
    # known to Celery while held (5.7+)
    assert (worker_state.requests.get("1") is request) is TRACKS_HELD
    consumer.fire(consumer.entries[0])
    assert asked == [("rate", request), ("slots", request), ("slots", request)]
    assert [e.secs for e in consumer.entries] == [0.5, 0.25]
    assert (consumer.widened, consumer.narrowed) == (2, 1)
    consumer.fire(consumer.entries[1])
    assert asked[-1] == ("slots", request) and len(asked) == 4  # the rate gate was not asked
    assert consumer.ran == [request] and len(pipeline.holds) == 0
    assert (consumer.widened, consumer.narrowed) == (2, 2)  # narrowed once per hold
    consumer.fire(consumer.entries[1])  # a timer entry firing twice changes nothing
    assert consumer.ran == [request] and (consumer.widened, consumer.narrowed) == (2, 2)


def test_queued_waits_in_its_gate_and_resumes_past_it(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], asked: list[tuple[str, Any]]
) -> None:
    rate, _slots = gates
    rate.answers = [QUEUED]
    consumer, request = Consumer(), TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    assert consumer.ran == [] and consumer.entries == [] and len(pipeline.holds) == 0
    assert (consumer.widened, consumer.narrowed) == (1, 0)
    (ticket,) = rate.queued
    assert ticket.request is request and ticket.stage == 0
    pipeline.resume(ticket)
    assert asked == [("rate", request), ("slots", request)]  # the next gate, not the same
    assert consumer.ran == [request] and (consumer.widened, consumer.narrowed) == (1, 1)


def test_a_queued_request_after_a_hold_narrows_once_for_each(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate]
) -> None:
    rate, slots = gates
    rate.answers = [Hold(0.1)]
    slots.answers = [QUEUED]
    consumer, request = Consumer(), TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    consumer.fire(consumer.entries[0])
    assert (consumer.widened, consumer.narrowed) == (2, 1) and consumer.ran == []
    pipeline.resume(slots.queued[0])
    assert (consumer.widened, consumer.narrowed) == (2, 2) and consumer.ran == [request]


class Parker:
    """The delay store's parker as the pipeline uses it."""

    def __init__(self, parks: bool) -> None:
        self.parks = parks
        self.parked: list[tuple[str, str, float]] = []

    def entry_of_message(self, message: Any, name: str, kind: str) -> tuple[str, Any]:
        return f"e-{message.headers['id']}", (name, kind)

    def park(self, eid: str, entry: Any, delay: float, request: Any = None) -> bool:
        self.parked.append((eid, entry[1], delay))
        return self.parks


def arriving(pipeline: Pipeline, parks: bool) -> tuple[Consumer, Any]:
    """A consumer whose pipeline is handed the delay store's arrival gate (as at its start)."""
    consumer = Consumer()
    arrival = SimpleNamespace(parker=Parker(parks), pop_slot=lambda task_id: None)
    pipeline.arrival = arrival
    return consumer, arrival


def test_a_hold_with_park_is_parked_and_acked_when_the_store_takes_it(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate]
) -> None:
    rate, _slots = gates
    rate.answers = [Hold(30.0, park="limit")]
    consumer, arrival = arriving(pipeline, parks=True)
    request = TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    assert arrival.parker.parked == [("e-1", "limit", 30.0)] and request.acked == 1
    assert rate.held_calls == [(request, Hold(30.0, park="limit"), True)]
    assert consumer.entries == [] and len(pipeline.holds) == 0 and consumer.ran == []
    assert (consumer.widened, consumer.narrowed) == (0, 0)  # acked: no prefetch to keep


@pytest.mark.parametrize("why", ["no delay store", "the store refuses", "protocol 1"])
def test_a_hold_with_park_that_cannot_be_parked_is_held_in_the_timer(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], why: str
) -> None:
    rate, _slots = gates
    rate.answers = [Hold(30.0, park="limit")]
    request = TaskRequest("1")
    if why == "no delay store":
        consumer = Consumer()
    else:
        consumer, _arrival = arriving(pipeline, parks=why != "the store refuses")
        if why == "protocol 1":  # no task name or id in the headers
            request._message = SimpleNamespace(headers={})
    pipeline.submit(consumer, request, "t")
    assert request.acked == 0 and consumer.ran == []
    assert rate.held_calls == [(request, Hold(30.0, park="limit"), False)]
    assert [e.secs for e in consumer.entries] == [30.0] and len(pipeline.holds) == 1
    assert (consumer.widened, consumer.narrowed) == (1, 0)
    consumer.fire(consumer.entries[0])  # asked again when due: runs
    assert consumer.ran == [request] and (consumer.widened, consumer.narrowed) == (1, 1)


def test_stop_drops_holds_and_bumps_the_epoch(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate]
) -> None:
    rate, slots = gates
    consumer = Consumer()
    pipeline.start(consumer)
    (tick_entry,) = consumer.repeating
    ((handle, started_on),) = rate.started
    assert tick_entry.secs == TICK and slots.started == rate.started and started_on is consumer
    assert isinstance(handle, GateHandle) and handle.consumer is consumer  # never the pipeline
    rate.answers = [Hold(1.0), Hold(2.0)]
    first, second = TaskRequest("1"), TaskRequest("2")
    pipeline.submit(consumer, first, "t")
    pipeline.submit(consumer, second, "t")
    assert len(pipeline.holds) == 2
    assert set(worker_state.requests) == ({"1", "2"} if TRACKS_HELD else set())
    epoch = pipeline.epoch
    pipeline.stop()
    assert pipeline.epoch == epoch + 1 and len(pipeline.holds) == 0
    assert all(e.cancelled for e in consumer.entries) and tick_entry.cancelled
    assert (rate.stops, slots.stops) == (1, 1)
    assert worker_state.requests == {}  # dropped from Celery's state: delivered again
    for entry in consumer.entries:  # a timer that fires all the same runs nothing
        consumer.fire(entry)
    assert consumer.ran == [] and (consumer.widened, consumer.narrowed) == (2, 0)
    pipeline.start(consumer)  # the next connection: ticking again
    assert len(consumer.repeating) == 2 and not consumer.repeating[1].cancelled


def test_start_twice_ticks_once(pipeline: Pipeline) -> None:
    consumer = Consumer()
    pipeline.start(consumer)
    pipeline.start(consumer)
    assert len(consumer.repeating) == 1


def test_finished_reaches_only_gates_that_hear_endings_once(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate]
) -> None:
    rate, slots = gates
    consumer = Consumer()
    pipeline.start(consumer)
    pipeline.register("rate_only", {"rate"})
    request, unheard = TaskRequest("1"), TaskRequest("2", "rate_only")
    pipeline.submit(consumer, request, "t")
    pipeline.submit(consumer, unheard, "rate_only")
    assert type(request) is not TaskRequest and isinstance(request, TaskRequest)  # hooked
    assert type(unheard) is TaskRequest and list(pipeline.admitted) == [id(request)]
    request.on_success((True, None, 0.1))  # a failure: on_success goes on to on_failure
    assert request.calls == ["success", "failure"]  # Celery's own callbacks still run
    assert slots.ended == [request] and rate.ended == []
    pipeline.finished(request)  # heard again (another callback): nothing more
    request.on_failure(None)
    assert slots.ended == [request] and pipeline.admitted == {}
    pipeline.finished(unheard)
    assert slots.ended == [request] and rate.ended == []


def test_an_ending_of_another_request_at_a_reused_id_is_not_heard(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate]
) -> None:
    _rate, slots = gates
    consumer = Consumer()
    pipeline.start(consumer)
    running, other = TaskRequest("1"), TaskRequest("2")
    pipeline.submit(consumer, running, "t")
    # *other* now sits where the address of *running* was (as after it was collected)
    pipeline.admitted[id(other)] = pipeline.admitted.pop(id(running))
    pipeline.finished(other)
    assert slots.ended == [] and pipeline.admitted[id(other)].request is running
    pipeline.admitted[id(running)] = pipeline.admitted.pop(id(other))
    pipeline.finished(running)
    assert slots.ended == [running]


def test_the_tick_finishes_a_request_celery_forgot_for_two_ticks_once(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], caplog: pytest.LogCaptureFixture
) -> None:
    rate, slots = gates
    consumer = Consumer()
    pipeline.start(consumer)
    request, other = TaskRequest("1"), TaskRequest("2")
    pipeline.submit(consumer, request, "t")
    pipeline.submit(consumer, other, "t")
    pipeline.tick()
    assert slots.ended == []  # still reserved in Celery's state
    request.time_start = 1.0  # it started (Celery's on_accepted)
    worker_state.task_ready(request)  # Celery forgot it; no callback reached the hook
    with caplog.at_level(logging.WARNING):
        pipeline.tick()
        assert slots.ended == []  # once may be a callback on its way
        pipeline.tick()
        assert slots.ended == [request]
        pipeline.tick()
        request.on_success((False, None, 0.1))  # a late callback: heard already
    assert slots.ended == [request] and rate.ended == []
    assert list(pipeline.admitted) == [id(other)]  # the other one still runs
    assert (rate.ticks, slots.ticks) == (4, 4)  # every gate ticks with the pipeline
    unseen = [r.getMessage() for r in caplog.records if "ended unseen" in r.getMessage()]
    assert unseen == ["celery-extras: t[1] ended unseen; freeing what its gates hold"]


def test_a_request_celery_dropped_before_it_started_is_heard_as_a_retry_in_0_s(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], caplog: pytest.LogCaptureFixture
) -> None:
    """A lost connection clears the semaphore's waiting list: the request never ran, and
    its message comes again; its gates must not hear it as a run that ended."""
    _rate, slots = gates
    consumer = Consumer()
    pipeline.start(consumer)
    request = TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    worker_state.task_ready(request)  # dropped: never accepted by the pool
    with caplog.at_level(logging.INFO):
        pipeline.tick()
        pipeline.tick()
    assert (slots.ended, slots.retries_heard) == ([request], [0.0])
    assert pipeline.admitted == {} and request.acked == 0
    said = [r.getMessage() for r in caplog.records if "celery-extras: t[1]" in r.getMessage()]
    assert said == ["celery-extras: t[1] was dropped before it ran; its message comes again"]


def test_the_tick_reads_celerys_state_through_compat(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], monkeypatch: pytest.MonkeyPatch
) -> None:
    _rate, slots = gates
    consumer = Consumer()
    pipeline.start(consumer)
    request = TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    pending = {"1": False}
    monkeypatch.setattr(compat, "request_pending", lambda r: pending[r.id])
    pipeline.tick()
    pipeline.tick()
    assert slots.ended == [request]


def test_the_hook_of_the_consumer_is_the_pipelines_listener(pipeline: Pipeline) -> None:
    consumer = Consumer()
    pipeline.start(consumer)
    hook = request_hook(consumer)
    assert request_hook(consumer) is hook
    request = TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    hook.listen(finish=None)  # the pipeline stopped listening: endings are not heard
    request.on_success((False, None, 0.1))
    assert pipeline.admitted != {}


def test_covered_acks_the_message_and_nothing_runs(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], asked: list[tuple[str, Any]]
) -> None:
    rate, _slots = gates
    rate.answers = [COVERED]
    consumer = Consumer()
    request = TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    assert request.acked == 1 and consumer.ran == [] and asked == [("rate", request)]
    assert not compat.request_pending(request) and (consumer.widened, consumer.narrowed) == (0, 0)
    # queued, then covered when the gate resumes it: narrowed once, acked, never run
    rate.answers = [QUEUED]
    queued = TaskRequest("2")
    pipeline.submit(consumer, queued, "t")
    pipeline.resume(rate.queued[0], COVERED)
    assert queued.acked == 1 and consumer.ran == [] and ("slots", queued) not in asked
    assert (consumer.widened, consumer.narrowed) == (1, 1)


def test_a_later_gate_parking_a_request_tells_the_earlier_gates_that_hear_endings(
    asked: list[tuple[str, Any]],
) -> None:
    """The first gate hears endings (as coalescing does), the second parks: the first hears
    that the request left this worker, for how long; the parked one is not its ending."""
    first, second = SlotsGate(asked), RateGate(asked)
    pipeline = Pipeline([first, second])
    assert pipeline.register("t", BOTH)
    second.answers = [Hold(30.0, park="limit")]
    consumer, _arrival = arriving(pipeline, parks=True)
    request = TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    assert first.yields == [(request, 30.0)] and first.ended == []
    assert request.acked == 1
    # a request queued in a gate and parked by it (park_queued): the gates before it hear too
    second.answers = [QUEUED]
    queued = TaskRequest("2")
    pipeline.submit(consumer, queued, "t")
    assert pipeline.park_queued(second.queued[0], "coalesce", 12.0) == "e-2"
    assert first.yields[-1] == (queued, 12.0) and queued.acked == 1
    assert (consumer.widened, consumer.narrowed) == (1, 1)
    pipeline.arrival = None  # a worker without a delay store
    second.answers = [QUEUED]
    pipeline.submit(consumer, TaskRequest("3"), "t")
    assert pipeline.park_queued(second.queued[-1], "coalesce", 5.0) is None  # no delay store
    pipeline.stop()
    worker_state_support.clear()


def test_finished_tells_the_gates_when_a_retry_comes(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate]
) -> None:
    _rate, slots = gates
    consumer = Consumer()
    retried, done = TaskRequest("1"), TaskRequest("2")
    for request in (retried, done):
        pipeline.submit(consumer, request, "t")
    pipeline.finished(retried, 7.0)
    pipeline.finished(done)
    assert slots.ended == [retried, done] and slots.retries_heard == [7.0, None]


def test_holder_ids_are_unique_per_delivery_and_name_their_gate() -> None:
    ids, other = HolderIds(), HolderIds()
    made = [ids() for _ in range(1000)] + [other() for _ in range(1000)]
    assert len(set(made)) == 2000
    assert all(h.startswith(f"{ids.worker}:") for h in made[:1000])
    assert ids.worker != other.worker and len(ids.worker) == 16
    ticket = Ticket(TaskRequest("1"), "t", Consumer())
    first = ticket.holder("coalesce", ids)
    assert ticket.holder("coalesce", ids) == first  # one per delivery: asked again as itself


def test_a_buckets_tag_is_the_digest_its_stored_keys_already_have() -> None:
    """Keys in users' stores are named by this digest: it must not change."""
    assert bucket_tag("tasks.add", "") == "{cfabf2d073a9e8e046fe}"
    digest = hashlib.sha1(b"tasks.add\0user:7", usedforsecurity=False).hexdigest()[:20]
    assert bucket_tag("tasks.add", "user:7") == f"{{{digest}}}"


# A resumed request on a green pool goes to the pool from a greenlet of the worker's timer.
#
# A gate resumes a waiting request as a slot frees: on gevent and eventlet that is heard in
# the ending task's own greenlet, whose ``spawn`` would wait for its own slot. The pipeline
# hands such a request over from a timer entry (here a fake consumer's, fired by the test);
# an arrival still goes at once, as on every other pool. A stop (warm, or a lost connection)
# that overtakes the handover drops the request: its message goes back to the broker unacked,
# and the gates that hear endings free what they hold for it, as for a retry in 0 s.


class GreenConsumer(Consumer):
    """A consumer whose pool says it is green (gevent's and eventlet's ``is_green``)."""

    def __init__(self, green: bool = True) -> None:
        super().__init__()
        self.pool = SimpleNamespace(is_green=green)


def queued(pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], consumer: Consumer,
           request: TaskRequest) -> Any:  # fmt: skip
    """*request* submitted and queued in the slots gate: its ticket."""
    gates[1].answers = [QUEUED]
    pipeline.submit(consumer, request, "t")
    (ticket,) = gates[1].queued
    return ticket


def test_a_resumed_request_goes_to_a_green_pool_from_the_timer(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate]
) -> None:
    consumer, request = GreenConsumer(), TaskRequest("1")
    ticket = queued(pipeline, gates, consumer, request)
    pipeline.resume(ticket)
    assert consumer.ran == []  # not from the caller's greenlet
    (entry,) = consumer.entries
    assert (entry.secs, entry.fun, entry.args) == (0, pipeline.hand, (ticket,))
    assert pipeline.admitted == {id(request): ticket} and compat.request_pending(request)
    consumer.fire(entry)
    assert consumer.ran == [request] and consumer.reserved_when_run == [True]
    assert pipeline.handing == {}
    consumer.fire(entry)  # a timer entry firing twice hands it over once
    assert consumer.ran == [request]
    assert (consumer.widened, consumer.narrowed) == (1, 1)


def test_an_arrival_goes_at_once_on_a_green_pool(pipeline: Pipeline) -> None:
    consumer, request = GreenConsumer(), TaskRequest("1")
    pipeline.submit(consumer, request, "t")
    assert consumer.ran == [request] and consumer.entries == []


def test_a_resumed_request_goes_at_once_on_other_pools(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate]
) -> None:
    consumer, request = GreenConsumer(green=False), TaskRequest("1")
    pipeline.resume(queued(pipeline, gates, consumer, request))
    assert consumer.ran == [request] and consumer.entries == [] and pipeline.handing == {}


def test_a_stop_before_the_handover_sends_the_request_back_and_frees_its_gates(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate]
) -> None:
    rate, slots = gates
    consumer, request, other = GreenConsumer(), TaskRequest("1"), TaskRequest("2")
    pipeline.submit(consumer, other, "t")  # running: keeps what it holds through the stop
    pipeline.resume(queued(pipeline, gates, consumer, request))
    pipeline.stop()
    assert pipeline.handing == {} and pipeline.admitted.keys() == {id(other)}
    assert request not in worker_state.reserved_requests and "1" not in worker_state.requests
    assert (slots.ended, slots.retries_heard, rate.ended) == ([request], [0.0], [])
    consumer.fire(consumer.entries[0])  # the timer fires all the same: nothing runs
    assert consumer.ran == [other] and request.acked == 0  # unacked: delivered again


def test_no_handover_once_a_stop_began_the_stop_drops_it(
    pipeline: Pipeline, gates: tuple[RateGate, SlotsGate], monkeypatch: pytest.MonkeyPatch
) -> None:
    _rate, slots = gates
    consumer, request = GreenConsumer(), TaskRequest("1")
    pipeline.resume(queued(pipeline, gates, consumer, request))
    monkeypatch.setattr(compat, "worker_stopping", lambda: True)
    consumer.fire(consumer.entries[0])  # Celery's loop has yet to see the signal
    assert consumer.ran == [] and pipeline.handing.keys() == {id(request)}
    pipeline.stop()
    assert pipeline.handing == {} and pipeline.admitted == {} and slots.ended == [request]
    assert request.acked == 0
