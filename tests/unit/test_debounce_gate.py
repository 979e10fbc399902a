"""debounce(): bad input named, and the gate's decisions through a real admission pipeline
with a fake consumer, on a fake clock (a worker with no store: its own table)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, shared_task
from celery.worker import state as worker_state

import celery_extras
from celery_extras import PolicyError, coalesce, debounce, limit
from celery_extras.admission.decorators import _STRATEGY
from celery_extras.admission.pipeline import Pipeline
from celery_extras.admission.registry import TaskPolicies, policies_of
from celery_extras.debounce.gate import DebounceGate
from celery_extras.debounce.spec import DebounceSpec
from celery_extras.policies import POLICIES
from tests.support import worker_state as worker_state_support
from tests.support.clock import FakeClock
from tests.support.fake_consumer import Consumer
from tests.support.shared_tasks import shared_tasks_isolated


def key(args: Any, kwargs: Any) -> str:
    return str(args[0])


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0,), {"key": key}, "wait 0: expected seconds above 0, up to 86400"),
        ((-1,), {"key": key}, "wait -1: expected seconds above 0"),
        ((math.nan,), {"key": key}, "wait nan: expected seconds above 0"),
        ((True,), {"key": key}, "wait True: expected seconds above 0"),
        (("1",), {"key": key}, "wait '1': expected seconds above 0"),
        ((1.0,), {"key": "account"}, "key 'account': expected a callable (args, kwargs) -> key"),
        ((1.0,), {"key": key, "max_wait": 0.5},
         "max_wait 0.5: expected None or seconds from wait (1) to 86400"),
        ((1.0,), {"key": key, "max_wait": 10**6}, "max_wait 1000000: expected None or seconds"),
        ((1.0,), {"key": key, "lease": 0.5}, "lease 0.5: expected seconds from 1 to 86400"),
        ((1.0,), {"key": key, "lease": "30"}, "lease '30': expected seconds from 1 to 86400"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_task_and_the_argument(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    app = Celery("unit", broker="memory://", set_as_current=False)
    celery_extras.install(app)
    with pytest.raises(PolicyError) as raised:

        @debounce(*args, **kwargs)
        @app.task(name="unit.t", shared=False)
        def t() -> None: ...

    assert str(raised.value).startswith(f"debounce() on task 'unit.t': {message}")


def test_it_composes_with_the_other_policies_and_its_gate_comes_right_after_coalescing() -> None:
    app = Celery("unit-compose", broker="memory://", set_as_current=False)
    celery_extras.install(app)
    with shared_tasks_isolated():  # the shared task is not the next apps'

        @debounce(1.0, key=key, max_wait=5.0)
        @coalesce(key=key)
        @limit("5/s")
        @shared_task(name="unit.debounced")
        def debounced(x: str) -> None: ...

        app.finalize()
    task = app.tasks["unit.debounced"]
    policies = policies_of(task)
    assert policies is not None and policies.debounce == DebounceSpec(1.0, key, 5.0, 30.0)
    assert policies.coalesce is not None and policies.limits
    assert task.__dict__["Strategy"] == _STRATEGY
    names = [p.name for p in POLICIES if p.name != "memoize"]  # memoize: asked first
    assert names[:3] == ["coalesce", "debounce", "limits"]
    with pytest.raises(TypeError, match="debounce"):
        debounce(1.0, key=key)(lambda: None)


# -- the gate, through a pipeline with a fake consumer --------------------------------------


class Request:
    """What the gate reads of a Celery request; its ack and pool callbacks recorded."""

    def __init__(self, *args: Any) -> None:
        self.id = f"r{args[1] if len(args) > 1 else id(self)}"
        self.args = args
        self.kwargs: dict[str, Any] = {}
        self.name = "t"
        self.message = self
        self.headers: dict[str, Any] = {}
        self.request_dict = {"task": "t", "args": list(args)}
        self.delivery_info: dict[str, Any] = {}
        self.acked = 0
        self.time_start: float | None = None

    def acknowledge(self) -> None:
        self.acked += 1

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


SETTINGS = {"debounce_on_store_error": "hold", "store_retry": 1.0, "delay_max_hold": 2.0}


class Debounced:
    """A debounce gate in a started pipeline, with the fake consumer it runs for."""

    def __init__(self, app: Celery, settings: dict[str, Any], clock: FakeClock) -> None:
        self.clock = clock
        self.gate = DebounceGate(app, settings, clock, clock)
        self.pipeline = Pipeline([self.gate])
        self.consumer = Consumer()
        self.pipeline.start(self.consumer)
        spec = DebounceSpec.build("t", 0.5, key, 2.0, 30.0)
        assert self.pipeline.register("t", TaskPolicies(debounce=spec))

    def submit(self, request: Request) -> None:
        self.pipeline.submit(self.consumer, request, "t")

    def at(self, seconds: float) -> None:
        """Time moves to *seconds* after the start; the gate's due asks run."""
        self.clock.now = 1000.0 + seconds
        self.gate.ask_due()

    def stop(self) -> None:
        self.pipeline.stop()
        worker_state_support.clear()


def idle(d: Debounced) -> bool:
    """Nothing held or covered in the gate's table (each key remembers its last run)."""
    states = d.gate.holds.local.keys.values()
    return all(s.run is None and s.waiting is None and s.empty() for s in states)


def local_app() -> Celery:
    app = Celery("unit-debounce", broker="memory://", set_as_current=False)
    celery_extras.install(app)
    return app


@pytest.fixture
def debounced() -> Iterator[Debounced]:
    d = Debounced(local_app(), SETTINGS, FakeClock(1000.0))
    yield d
    d.stop()


def test_a_burst_runs_once_with_its_last_message_once_quiet(debounced: Debounced) -> None:
    d, c = debounced, debounced.consumer
    burst = [Request("a", i) for i in range(3)]
    for i, request in enumerate(burst):
        d.at(0.1 * i)
        d.submit(request)
    other = Request("b", 9)
    d.submit(other)
    assert c.ran == [] and c.prefetch == 4  # all held, unacked, the window widened
    d.at(0.61)  # r0 and r1 were told to ask again by now: covered by r2, acked
    assert [r.acked for r in burst] == [1, 1, 0] and c.ran == []
    d.at(0.71)  # r2 (and b9) quiet for wait: they run
    assert c.ran == [burst[2], other] and c.prefetch == 0
    info = d.gate.info()
    assert (info["runs"], info["debounced"], info["waited"]) == (2, 2, 4)
    assert info["tasks"]["t"] == {"wait": 0.5, "max_wait": 2.0, "lease": 30.0,
                                  "running": 2, "waiting": 0}  # fmt: skip
    c.scheduled.clear()
    burst[2].on_success((False, {"run": "r2"}, 0.1))  # the run ends: r0, r1 end with it
    ((_, _, job),) = [s for s in c.scheduled if s[1].__name__ == "_run"]
    assert (job[1], job[2], [m.id for m in job[3]]) == ("t", "r2", ["r0", "r1"])
    assert [m.context["args"] for m in job[3]] == [["a", 0], ["a", 1]]  # their own endings
    other.on_success((False, None, 0.1))
    assert idle(d) and d.gate.info()["tasks"]["t"]["running"] == 0


def test_a_message_while_its_key_runs_waits_for_the_run_to_end(debounced: Debounced) -> None:
    d, c = debounced, debounced.consumer
    first, during = Request("a", 1), Request("a", 2)
    d.submit(first)
    d.at(0.51)
    assert c.ran == [first]
    d.submit(during)
    d.at(2.0)  # quiet for long enough, but the key runs
    assert c.ran == [first] and d.gate.queued() == 1
    first.on_success((False, None, 0.1))  # its end asks this worker's waiting message again
    assert c.ran == [first, during] and c.prefetch == 0
    during.on_failure(None)
    assert idle(d)


def test_the_waiting_messages_are_dropped_at_stop_and_their_burst_waits_for_them(
    debounced: Debounced,
) -> None:
    d = debounced
    request = Request("a", 1)
    d.submit(request)
    d.pipeline.stop()
    assert d.gate.queued() == 0 and request.acked == 0  # the broker delivers it again
    (state,) = d.gate.holds.local.keys.values()
    assert state.waiting is not None and (state.waiting.id, state.waiting.holder) == ("r1", "")
    d.pipeline.start(d.consumer)
    again = Request("a", 1)  # the same message, delivered again
    d.submit(again)
    d.at(0.51)
    assert d.consumer.ran == [again]


@pytest.mark.parametrize(("on_error", "ran"), [("hold", 0), ("run", 2)])
def test_a_store_that_cannot_be_reached_holds_or_runs_as_told(on_error: str, ran: int) -> None:
    app = Celery("unit-debounce-down", broker="memory://", set_as_current=False)
    app.conf.extras_redis_url = "redis://127.0.0.1:1/0"  # nothing listens: store down
    celery_extras.install(app)
    d = Debounced(app, {**SETTINGS, "debounce_on_store_error": on_error}, FakeClock(1000.0))
    try:
        d.submit(Request("a", 1))
        d.submit(Request("a", 2))
        assert len(d.consumer.ran) == ran and d.gate.info()["unheld"] == ran
        assert len(d.pipeline.holds) == 2 - ran  # held in the timer: asked again in 1 s
        assert (d.gate.info()["holds"], d.gate.info()["store"]) == ("shared", "down")
    finally:
        d.stop()
