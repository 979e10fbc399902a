"""The delay store's gate hands a message it held (the store away) back to Celery's own
strategy, called the way Celery's consumer calls it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest.mock import Mock

from celery import Celery
from kombu.message import Message
from kombu.serialization import dumps

from celery_extras.delay.gate import ArrivalGate


def test_a_message_held_while_the_store_was_away_reaches_celerys_strategy_again() -> None:
    """Protocol 2 carries the task name in its headers and Celery's consumer passes no
    body: passing the decoded body made Celery read it as protocol 1 and refuse it
    ("Task keyword arguments must be a mapping"), so the held task never ran."""
    app = Celery("t", set_as_current=False)

    @app.task(name="t.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    app.finalize()
    consumer = Mock(hostname="w@x", disable_rate_limits=True, task_buckets={})
    consumer.controller.state.revoked = set()
    timers: list[Callable[[], None]] = []

    def call_after(seconds: float, fun: Any, args: tuple[Any, ...] = (), priority: int = 0) -> Any:
        timers.append(lambda: fun(*args))
        return Mock()

    consumer.timer.call_after = call_after
    consumer.strategies = {"t.add": add.start_strategy(app, consumer)}
    content_type, encoding, body = dumps(([2, 3], {}, {}), serializer="json")
    message = Message(
        body=body, content_type=content_type, content_encoding=encoding, channel=Mock(),
        headers={"id": "held-1", "task": "t.add", "lang": "py", "root_id": "held-1",
                 "parent_id": None, "group": None, "retries": 0, "eta": None,
                 "expires": None, "timelimit": [None, None], "argsrepr": "", "kwargsrepr": "",
                 "origin": "test"},
    )  # fmt: skip
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
