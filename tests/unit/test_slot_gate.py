"""concurrency(): bad input named, the pure slot table and wait queues on a fake clock, and the
slot gate's decisions (worker scope, store down) through a real admission pipeline with a fake
consumer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, shared_task
from celery.worker import state as worker_state
from redis.exceptions import ConnectionError as StoreConnectionError
from redis.exceptions import TimeoutError as StoreTimeout

import celery_extras
from celery_extras import ExponentialBackoff, PolicyError, compat, concurrency, limit, retry_policy
from celery_extras.admission.decorators import _STRATEGY
from celery_extras.admission.gate import HolderIds, Ticket
from celery_extras.admission.pipeline import Pipeline
from celery_extras.admission.registry import TaskPolicies, policies_of
from celery_extras.admission.store_round import PASSES
from celery_extras.concurrency.gate import SlotGate
from celery_extras.concurrency.kept_slots import FRESH
from celery_extras.concurrency.slot_table import SlotTable, WaitQueues
from celery_extras.concurrency.slots import Grant, StoreSlots
from celery_extras.concurrency.spec import ConcurrencySpec
from celery_extras.store.client import store_user
from tests.support import worker_state as worker_state_support
from tests.support.clock import FakeClock
from tests.support.fake_consumer import Consumer


def make_app(name: str = "unit") -> Celery:
    app = Celery(name, broker="memory://", set_as_current=False)
    celery_extras.install(app)
    return app


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0,), {}, "concurrency() on task 'unit.t': n 0: expected an int from 1 to 1000000"),
        ((-2,), {}, "concurrency() on task 'unit.t': n -2: expected an int"),
        ((1.5,), {}, "concurrency() on task 'unit.t': n 1.5: expected an int"),
        (("2",), {}, "concurrency() on task 'unit.t': n '2': expected an int"),
        ((True,), {}, "concurrency() on task 'unit.t': n True: expected an int"),
        ((2,), {"lease": 0}, "concurrency() on task 'unit.t': lease 0: expected seconds from 1"),
        ((2,), {"lease": float("nan")}, "concurrency() on task 'unit.t': lease nan"),
        ((2,), {"lease": "30"}, "concurrency() on task 'unit.t': lease '30'"),
        ((2,), {"lease": 10**6}, "concurrency() on task 'unit.t': lease 1000000"),
        ((2,), {"scope": "cluster"},
         "concurrency() on task 'unit.t': scope 'cluster': expected 'global' or 'worker'"),
        ((2,), {"key": "customer"},
         "concurrency() on task 'unit.t': key 'customer': expected a callable"),
    ],
)  # fmt: skip
def test_bad_concurrency_names_task_and_argument(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    app = make_app()
    with pytest.raises(PolicyError) as info:

        @concurrency(*args, **kwargs)
        @app.task(name="unit.t", shared=False)
        def t() -> None: ...

    assert str(info.value).startswith(message)


def test_composes_with_limit_and_retry_policy_in_either_order() -> None:
    app = make_app("unit-compose")

    @concurrency(2, key=lambda a, k: a[0])
    @limit("5/s")
    @retry_policy(on=KeyError, policy=ExponentialBackoff(base=1, cap=2))
    @app.task(name="unit.a")
    def a(x: str) -> None: ...

    @retry_policy(on=KeyError, policy=ExponentialBackoff(base=1, cap=2))
    @limit("5/s")
    @concurrency(3, scope="worker", lease=5)
    @app.task(name="unit.b")
    def b(x: str) -> None: ...

    @concurrency(1)
    @shared_task(name="unit.c")
    def c() -> None: ...

    app.finalize()
    expected = (("unit.a", 2, "global"), ("unit.b", 3, "worker"), ("unit.c", 1, "global"))
    for name, n, scope in expected:
        task = app.tasks[name]
        policies = policies_of(task)
        assert policies is not None and policies.concurrency is not None
        assert (policies.concurrency.n, policies.concurrency.scope) == (n, scope)
        assert task.__dict__["Strategy"] == _STRATEGY
    assert policies_of(app.tasks["unit.a"]).limits  # type: ignore[union-attr]
    assert policies_of(app.tasks["unit.b"]).retry is not None  # type: ignore[union-attr]


def test_slot_table_caps_holders_and_reclaims_expired_leases() -> None:
    clock = FakeClock(100.0)
    table = SlotTable(clock)
    b = ("t", "")
    assert table.acquire(b, "h1", 2, 30.0) == 0.0
    clock.now = 110.0
    assert table.acquire(b, "h2", 2, 30.0) == 0.0
    assert table.acquire(b, "h3", 2, 30.0) == pytest.approx(20.0)  # h1's lease ends at 130
    assert table.acquire(b, "h1", 2, 30.0) == 0.0  # already a holder: idempotent
    assert table.renew(b, "h2", 30.0)
    clock.now = 131.0
    assert table.holding(b) == 2  # h1 renewed by its idempotent acquire at 110 (until 140)
    clock.now = 140.5  # h1 ran out; h2 renewed at 110 until 140 too
    assert table.holding(b) == 0
    assert not table.renew(b, "h1", 30.0)
    assert table.buckets() == 0  # empty buckets take no memory
    assert table.acquire(b, "h3", 2, 30.0) == 0.0
    assert table.release(b, "h3") and not table.release(b, "h3")
    assert table.buckets() == 0


def test_idle_keys_cost_nothing() -> None:
    table = SlotTable(FakeClock())
    queues: WaitQueues[int] = WaitQueues()
    for i in range(10_000):
        b = ("t", str(i))
        table.acquire(b, "h", 1, 30.0)
        queues.push(b, i)
        assert queues.pop(b) == i
        table.release(b, "h")
    assert table.buckets() == 0 and queues.buckets() == [] and len(queues) == 0


def test_wait_queues_are_fifo_per_bucket() -> None:
    q: WaitQueues[str] = WaitQueues()
    for item in ("a1", "a2", "a3"):
        q.push(("t", "a"), item)
    q.push(("t", "b"), "b1")
    assert q.pop(("t", "a")) == "a1"
    q.push_front(("t", "a"), "a1")
    assert [q.pop(("t", "a")) for _ in range(3)] == ["a1", "a2", "a3"]
    assert q.remove(("t", "b"), "b1") and len(q) == 0 and q.pop(("t", "b")) is None


# -- the gate, through a pipeline with a fake consumer --------------------------------------


class Request:
    """What the gate reads of a Celery request; pool callbacks recorded on the consumer."""

    def __init__(self, *args: Any) -> None:
        self.id = f"r{id(self)}"
        self.args = args
        self.kwargs: dict[str, Any] = {}
        self.name = "t"
        self.time_start: float | None = None

    def on_accepted(self, pid: Any, time_accepted: Any) -> None:
        pass

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> None:
        worker_state.task_ready(self)

    def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> None:
        worker_state.task_ready(self)

    def on_timeout(self, soft: bool, timeout: Any) -> None:
        pass

    def execute_using_pool(self, pool: Any, **kwargs: Any) -> None:
        pass

    def terminate(self, pool: Any, signal: Any = None) -> None:
        pass

    def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> None:
        pass


SETTINGS = {"concurrency_on_store_error": "local", "store_retry": 1.0}


class Slots:
    """A slot gate in a started pipeline, with the fake consumer it runs for."""

    def __init__(self, app: Celery, settings: dict[str, Any], clock: FakeClock) -> None:
        self.gate = SlotGate(app, settings, clock)
        self.pipeline = Pipeline([self.gate])
        self.consumer = Consumer()
        self.pipeline.start(self.consumer)

    def register(self, name: str, spec: ConcurrencySpec) -> None:
        assert self.pipeline.register(name, TaskPolicies(concurrency=spec))

    def submit(self, request: Request, name: str = "t") -> None:
        """*request* arrives, as its strategy hands it on: it enters the pipeline."""
        self.pipeline.submit(self.consumer, request, name)

    def stop(self) -> None:
        self.pipeline.stop()
        worker_state_support.clear()


def store_down_app() -> Celery:
    app = Celery("unit-slots", broker="memory://", set_as_current=False)
    app.conf.extras_redis_url = "redis://127.0.0.1:1/0"  # nothing listens: store down
    celery_extras.install(app)
    return app


@pytest.fixture
def slots() -> Iterator[Slots]:
    slots = Slots(store_down_app(), SETTINGS, FakeClock())
    yield slots
    slots.stop()


def test_worker_scope_fifo_per_key_and_release_on_every_ending(slots: Slots) -> None:
    g, c = slots.gate, slots.consumer
    slots.register("t", ConcurrencySpec(1, "worker", lambda a, k: a[0], 30.0))
    reqs = [Request("a"), Request("a"), Request("b"), Request("a")]
    for r in reqs:
        slots.submit(r)
    assert c.ran == [reqs[0], reqs[2]]  # a and b in parallel, the other a's wait
    assert c.prefetch == 2 and g.info()["tasks"]["t"] == {
        "n": 1, "scope": "worker", "per_key": True, "lease": 30.0, "cap": 1, "holding": 2,
        "waiting": 2,
    }  # fmt: skip
    reqs[0].on_failure(None)  # the request's class was swapped: its ending frees the slot
    assert c.ran == [reqs[0], reqs[2], reqs[1]]
    reqs[1].on_success((False, None, 0.1))
    assert c.ran[-1] is reqs[3] and c.prefetch == 0
    reqs[3].on_timeout(True, 1)  # a soft time limit: still running
    assert g.info()["tasks"]["t"]["holding"] == 2
    reqs[3].on_timeout(False, 1)
    reqs[2].on_success((True, None, 0.1))
    assert g.info()["holding"] == 0 and g.counts["released"] == 4
    assert g.local.table.buckets() == 0


def test_a_key_that_raises_is_logged_and_shares_the_task_slot(
    slots: Slots, caplog: pytest.LogCaptureFixture
) -> None:
    slots.register("t", ConcurrencySpec(1, "worker", lambda a, k: a[5], 30.0))
    with caplog.at_level(logging.ERROR):
        slots.submit(Request("a"))
        slots.submit(Request("b"))
    assert len(slots.consumer.ran) == 1 and len(slots.gate.queues) == 1
    assert "concurrency key of t failed; using its shared slots" in caplog.text


def test_an_ending_celery_saw_but_we_did_not_frees_the_slot_at_renewal(slots: Slots) -> None:
    c = slots.consumer
    slots.register("t", ConcurrencySpec(1, "worker", None, 30.0))
    first, second = Request(), Request()
    slots.submit(first)
    slots.submit(second)
    worker_state.task_ready(first)  # Celery forgot it, no callback reached us
    slots.pipeline.tick()
    assert c.ran == [first]
    slots.pipeline.tick()
    assert c.ran == [first, second]


@pytest.mark.parametrize(("on_error", "ran"), [("local", 2), ("allow", 3), ("delay", 0)])
def test_store_down_follows_the_setting_and_is_logged_once(
    caplog: pytest.LogCaptureFixture, on_error: str, ran: int
) -> None:
    slots = Slots(store_down_app(), {**SETTINGS, "concurrency_on_store_error": on_error},
                  FakeClock())  # fmt: skip
    g, c = slots.gate, slots.consumer
    try:
        slots.register("t", ConcurrencySpec(2, "global", None, 30.0))
        with caplog.at_level(logging.ERROR):
            for _ in range(3):
                slots.submit(Request())
        assert len(c.ran) == ran and len(g.queues) == 3 - ran
        outages = [r for r in caplog.records if "the store failed (ConnectionError" in r.message]
        assert len(outages) == 1
        assert "; concurrency slots: " in outages[0].message
        assert f"extras_concurrency_on_store_error={on_error!r}" in outages[0].message
        assert g.health.reason.startswith("ConnectionError: ")
        assert g.info()["store"] == "down"
        if on_error == "delay":  # asks again after extras_limit_store_retry
            assert c.scheduled[-1][0] == pytest.approx(1.0)
    finally:
        slots.stop()


def test_terminate_and_cancel_free_the_slot_of_a_running_task_only(slots: Slots) -> None:
    c = slots.consumer
    slots.register("t", ConcurrencySpec(1, "worker", None, 30.0))
    first, second, third = Request(), Request(), Request()
    for r in (first, second, third):
        slots.submit(r)
    first.terminate(None)  # not started yet: Celery terminates it when the pool accepts it
    assert c.ran == [first]
    first.time_start = 1.0
    first.terminate(None)
    assert c.ran == [first, second]
    second.time_start = 1.0
    second.cancel(None)
    assert c.ran == [first, second, third]


def test_request_pending_is_celerys_own_bookkeeping() -> None:
    request = Request()
    assert not compat.request_pending(request)  # type: ignore[arg-type]
    compat.task_reserved(request)  # type: ignore[arg-type]
    assert compat.request_pending(request)  # type: ignore[arg-type]
    worker_state.task_ready(request)
    assert not compat.request_pending(request)  # type: ignore[arg-type]


def test_a_running_request_is_pending_after_the_connection_went_seed_665725() -> None:
    """Celery 5.5 and 5.6 empty the reserved set as the connection is lost, running
    requests with it (celery#10345): one still in the active set runs on, its slot held."""
    request = Request()
    compat.task_reserved(request)  # type: ignore[arg-type]
    worker_state.active_requests.add(request)  # accepted by the pool: its body runs
    worker_state.reserved_requests.clear()  # Celery 5.5's Consumer.on_close
    try:
        assert compat.request_pending(request)  # type: ignore[arg-type]
    finally:
        worker_state.task_ready(request)
    assert not compat.request_pending(request)  # type: ignore[arg-type]


def test_worker_scope_needs_no_store_and_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("unit-nostore", broker="amqp://guest@127.0.0.1:1//", set_as_current=False)
    celery_extras.install(app)
    slots = Slots(app, SETTINGS, FakeClock())
    try:
        slots.register("t", ConcurrencySpec(2, "worker", None, 30.0))
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                slots.submit(Request())
        assert len(slots.consumer.ran) == 2 and len(slots.gate.queues) == 1
        assert caplog.records == [] and slots.gate.info()["store"] == "ok"
    finally:
        slots.stop()


class LosingSlots:
    """A store of global slots (a ``RedisSlots``' calls) that does every take, and loses
    the reply while :attr:`losing` (the path stalls: the call times out after the store did
    it); it records what it holds and what it was asked to free."""

    def __init__(self) -> None:
        self.losing = False
        self.failing_release = False
        self.held: set[str] = set()
        self.freed: list[str] = []

    def acquire_call(self, name: str, key: str, holder: str, *args: Any) -> Any:
        def take() -> int:
            self.held.add(holder)
            if self.losing:
                raise StoreTimeout("no reply from the store in 0.25 s")
            return 0

        return take

    def acquired(self, reply: Any) -> float:
        return float(reply)

    def holders(self, reply: Any) -> int:
        return len(self.held)

    def release(self, name: str, key: str, holder: str) -> bool:
        if self.failing_release:
            raise StoreTimeout("no reply from the store in 0.25 s")
        self.freed.append(holder)
        found = holder in self.held
        self.held.discard(holder)
        return found

    def release_call(self, name: str, key: str, holder: str) -> Any:
        return lambda: self.release(name, key, holder)


def losing_slots(app_name: str) -> tuple[FakeClock, LosingSlots, StoreSlots]:
    """A worker's global slots on a :class:`LosingSlots` store, at 100 s of a fake clock."""
    clock = FakeClock(100.0)
    health = store_user(make_app(app_name), logging.getLogger("t"), "concurrency slots", "-",
                        clock)  # fmt: skip
    redis = LosingSlots()
    slots = StoreSlots(lambda: redis, health, HolderIds(), clock)  # type: ignore[arg-type,return-value]
    return clock, redis, slots


def test_a_kept_slot_goes_to_the_next_request_and_back_once_stale_when_the_store_answers() -> None:
    """A slot freed while the store says its bucket is roomy is kept for the worker's next
    request (taken unasked); once the store's word is stale it goes back, and when the
    store does not answer then, it is freed once it does (not left until its lease ends)."""
    clock, redis, slots = losing_slots("unit-kept")
    b = ("t", "")

    assert slots.acquire(b, "h1", 100, 30.0, more=False) == 0.0  # 1 of 100 held: roomy
    grant = Grant(b, "h1", slots, 30.0, clock.now)
    assert slots.keep(grant) and slots.reuse(b) is grant and slots.reuse(b) is None
    assert slots.keep(grant)
    clock.now += FRESH / 2
    slots.settle()
    assert redis.freed == [] and slots.reuse(b) is grant  # still fresh: kept, given out
    assert slots.keep(grant)
    clock.now += FRESH
    redis.failing_release = True
    slots.settle()  # stale: given back, but the store does not answer
    assert redis.freed == [] and slots.unsure == {(b, "h1"): clock.now + 30.0}
    assert slots.reuse(b) is None
    redis.failing_release = False
    clock.now += 1.5
    slots.settle()
    assert redis.freed == ["h1"] and slots.unsure == {}

    assert slots.acquire(b, "h2", 3, 30.0, more=False) == 0.0  # a cap under MIN_CAP
    assert not slots.keep(Grant(b, "h2", slots, 30.0, clock.now))


def test_a_slot_is_kept_as_its_request_ends_not_when_the_ending_round_is_answered() -> None:
    """The slot gate decides to keep a freed slot as the request ends (``ending_call``,
    which then hands no release): the round carrying the other gates' endings may be
    answered after the store's word went stale, and the slot is still not released then,
    on the loop, as a call of its own; the worker's next request takes it."""
    clock, redis, slots = losing_slots("unit-kept-ending")
    gate = SlotGate(store_down_app(), SETTINGS, clock)
    gate.store, gate.health = slots, slots.health
    b = ("t", "")
    assert slots.acquire(b, "h1", 100, 30.0, more=False) == 0.0  # 1 of 100 held: roomy
    ending = Ticket(Request(), "t", consumer=None)
    gate.grants[id(ending.request)] = grant = Grant(b, "h1", slots, 30.0, clock.now)

    assert gate.ending_call(ending) is PASSES
    clock.now += FRESH  # the round waits (a coalescing finish in it) past the store's word
    gate.finished(ending)
    assert redis.freed == [] and gate.counts["released"] == 1 and gate.grants == {}
    assert slots.acquire(b, "h2", 100, 30.0, more=False) == 0.0  # the word is fresh again
    assert slots.reuse(b) is grant and redis.freed == []


def test_a_slot_the_store_may_hold_for_nobody_is_freed_once_it_answers() -> None:
    """A take whose reply was lost, or a failed release, leaves a slot the store may hold
    though no request uses it: freed (``settle``) once the store answers, not kept until
    its lease ends; one asked again under its holder and answered is in use, not freed;
    one past its lease is forgotten; a take the store refused the connection to did nothing."""
    clock, redis, slots = losing_slots("unit-settle")
    b = ("t", "")

    redis.losing = True
    assert slots.acquire(b, "h1", 1, 30.0, more=False) is None  # lost: the store holds h1
    assert slots.unsure == {(b, "h1"): 130.0} and redis.held == {"h1"}
    slots.settle()
    assert redis.freed == []  # the store backs off: asked when it may answer
    clock.now = 101.5
    redis.losing = False
    slots.settle()
    assert redis.freed == ["h1"] and redis.held == set() and slots.unsure == {}

    redis.losing = True
    clock.now = 103.0
    assert slots.acquire(b, "h2", 1, 30.0, more=False) is None
    redis.losing = False
    clock.now = 104.5
    assert slots.acquire(b, "h2", 1, 30.0, more=False) == 0.0  # asked again: held, in use
    slots.settle()
    assert slots.unsure == {} and redis.freed == ["h1"] and redis.held == {"h2"}

    redis.failing_release = True
    slots.release(Grant(b, "h2", slots, 30.0, clock.now))  # fails: the store holds h2
    assert slots.unsure == {(b, "h2"): 134.5}
    redis.failing_release = False
    clock.now = 106.0
    slots.settle()
    assert redis.freed == ["h1", "h2"] and slots.unsure == {}

    redis.losing = True
    assert slots.acquire(b, "h3", 1, 30.0, more=False) is None
    clock.now = 136.5  # past its lease: the store let it go itself
    redis.losing = False
    slots.settle()
    assert slots.unsure == {} and redis.freed == ["h1", "h2"]

    asked: list[str] = []

    def refused(name: str, key: str, holder: str, *args: Any) -> Any:
        asked.append(holder)
        raise StoreConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    redis.acquire_call = refused  # type: ignore[method-assign]
    clock.now = 140.0
    assert slots.acquire(b, "h4", 1, 30.0, more=False) is None
    assert asked == ["h4"] and slots.unsure == {}
