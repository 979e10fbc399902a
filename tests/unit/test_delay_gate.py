"""The delay store's gate hands a message it held (the store away) back to Celery's own
strategy, called the way Celery's consumer calls it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import Mock

from celery import Celery
from kombu.message import Message
from kombu.serialization import dumps

from celery_extras.delay.gate import ArrivalGate
from celery_extras.delay.parking import Park


def app_with_add() -> tuple[Celery, Any]:
    app = Celery("t", set_as_current=False)

    @app.task(name="t.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    app.finalize()
    return app, add


def consumer_with_timers() -> tuple[Mock, list[Callable[[], None]]]:
    """A consumer whose timer entries wait in the list returned, for the test to run."""
    consumer = Mock(hostname="w@x", disable_rate_limits=True, task_buckets={})
    consumer.controller.state.revoked = set()
    timers: list[Callable[[], None]] = []

    def call_after(seconds: float, fun: Any, args: tuple[Any, ...] = (), priority: int = 0) -> Any:
        timers.append(lambda: fun(*args))
        return Mock()

    consumer.timer.call_after = call_after
    return consumer, timers


def add_message(task_id: str, eta: str | None = None) -> Message:
    """A protocol 2 message of ``t.add(2, 3)``."""
    content_type, encoding, body = dumps(([2, 3], {}, {}), serializer="json")
    return Message(
        body=body, content_type=content_type, content_encoding=encoding, channel=Mock(),
        headers={"id": task_id, "task": "t.add", "lang": "py", "root_id": task_id,
                 "parent_id": None, "group": None, "retries": 0, "eta": eta,
                 "expires": None, "timelimit": [None, None], "argsrepr": "", "kwargsrepr": "",
                 "origin": "test"},
    )  # fmt: skip


def test_a_message_held_while_the_store_was_away_reaches_celerys_strategy_again() -> None:
    """Protocol 2 carries the task name in its headers and Celery's consumer passes no
    body: passing the decoded body made Celery read it as protocol 1 and refuse it
    ("Task keyword arguments must be a mapping"), so the held task never ran."""
    app, add = app_with_add()
    consumer, timers = consumer_with_timers()
    consumer.strategies = {"t.add": add.start_strategy(app, consumer)}
    message = add_message("held-1")
    gate = ArrivalGate(app, Mock(), eta_store=False, eta_threshold=60.0, store_retry=1.0)

    gate._wait_for_store(consumer, "t.add", message, Mock())
    assert consumer.on_task_request.call_count == 0 and len(timers) == 1
    timers[0]()  # the store answers again
    (request,), _ = consumer.on_task_request.call_args
    request_args: Any = request.args
    assert request.id == "held-1" and request.name == "t.add" and list(request_args) == [2, 3]
    assert len(gate.holds) == 0  # nothing left held
    qos = consumer.qos  # the prefetch window widened while held, narrowed once released
    assert qos.increment_eventually.call_count == qos.decrement_eventually.call_count == 1


def test_an_eta_park_in_doubt_is_parked_again_even_once_its_eta_is_near_seed_260130() -> None:
    """Chaos seed 260130: an ETA task's park timed out (the store had stored it); held and
    delivered again 1 s later, its ETA was then within the threshold, so the worker ran its
    copy and the store's copy ran too. A message once in doubt is settled by a park only."""
    app, add = app_with_add()
    consumer, timers = consumer_with_timers()
    now = [datetime(2026, 11, 29, 8, 26, 15, tzinfo=UTC)]
    parker = Mock()
    parker.entry_of_message.return_value = ("eid-1", Mock())
    parker.park.side_effect = [Park.IN_DOUBT, Park.KEPT, Park.PARKED]
    gate = ArrivalGate(app, parker, eta_store=True, eta_threshold=1.0, store_retry=1.0,
                       wall=lambda: now[0])  # fmt: skip
    consumer.strategies = {"t.add": gate.wrap(consumer, "t.add", add.start_strategy(app, consumer))}
    message = add_message("eta-1", eta=(now[0] + timedelta(seconds=1.5)).isoformat())
    ack = Mock()

    consumer.strategies["t.add"](message, None, ack, Mock(), [])
    assert parker.park.call_count == 1 and len(timers) == 1 and not ack.called
    for turn in (1, 2):  # 1 s later the ETA is 0.5 s away, then past: still parked, not run
        now[0] += timedelta(seconds=1)
        timers[turn - 1]()
    assert parker.park.call_count == 3  # in doubt, then kept (the store away), then parked
    assert consumer.on_task_request.call_count == 0  # never run here: the store's copy runs
    assert ack.call_count == 1 and len(gate.holds) == 0 and not gate._in_doubt
