"""The worker's glue: Celery's semaphore takes waiting requests in priority order, the
prefetch window is widened for them (bounded), and the app gets ten Redis levels."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured
from kombu.asynchronous.semaphore import LaxBoundedSemaphore

import celery_extras
from celery_extras import settings_of
from celery_extras.priority.buffer import PriorityBuffer
from celery_extras.priority.step import PriorityStep, max_priorities
from celery_extras.priority.transport import STEPS
from celery_extras.priority.waiting import PriorityWaiters, level_function
from tests.support.shared_tasks import shared_tasks_isolated


class QoS:
    def __init__(self) -> None:
        self.value = 4

    def increment_eventually(self, n: int = 1) -> None:
        self.value += n

    def decrement_eventually(self, n: int = 1) -> None:
        self.value -= n


def request(priority: Any, queue: str = "q", tag: str = "") -> Any:
    return SimpleNamespace(delivery_info={"priority": priority, "routing_key": queue}, tag=tag)


def ordered(extra: int | None = None, driver: str = "redis") -> tuple[Any, Any, Any]:
    semaphore = LaxBoundedSemaphore(1)
    consumer = SimpleNamespace(qos=QoS())
    level_of = level_function(driver, {"q": 9})
    assert level_of is not None
    waiters = PriorityWaiters(PriorityBuffer(), level_of, lambda: consumer, extra)
    from celery_extras import compat

    assert compat.order_semaphore_waiting(semaphore, waiters)
    return semaphore, waiters, consumer


def test_a_freed_process_takes_the_best_request_waiting() -> None:
    semaphore, waiters, consumer = ordered()
    ran: list[Any] = []
    semaphore.acquire(ran.append, "first")  # the one process: taken at once
    for tag, priority in [("nine", 9), ("none", None), ("two", 2), ("two-b", 2), ("zero", 0)]:
        semaphore.acquire(ran.append, request(priority, tag=tag))
    assert consumer.qos.value == 4 + 5  # the waiting do not count against the window
    for _ in range(5):
        semaphore.release()
    assert [getattr(r, "tag", r) for r in ran] == [
        "first", "none", "zero", "two", "two-b", "nine"
    ]  # fmt: skip
    assert consumer.qos.value == 4 and waiters.info()["served"] == 5
    semaphore.release()
    assert semaphore.value == 1  # nothing waits: the count goes back up


def test_the_waiting_args_are_the_request_celery_passes() -> None:
    semaphore, _, _ = ordered()
    ran: list[str] = []
    semaphore.acquire(lambda r: ran.append(r.delivery_info["priority"]), request(5))
    semaphore.acquire(lambda r: ran.append(r.delivery_info["priority"]), request(7))
    semaphore.acquire(lambda r: ran.append(r.delivery_info["priority"]), request(3))
    semaphore.release()
    semaphore.release()
    assert ran == [5, 3, 7]


def test_widening_is_bounded_and_a_lost_connection_forgets_it() -> None:
    semaphore, waiters, consumer = ordered(extra=2)
    semaphore.acquire(lambda *a: None)
    for priority in (9, 8, 7):
        semaphore.acquire(lambda *a: None, request(priority))
    assert consumer.qos.value == 6 and waiters.info()["widened"] == 2
    assert waiters.info()["waiting"] == {"q": {"7": 1, "8": 1, "9": 1}}
    semaphore.release()  # the 7 goes: two wait, the window stays two wider
    assert consumer.qos.value == 6
    semaphore.release()
    assert consumer.qos.value == 5 and waiters.info()["widened"] == 1
    semaphore.clear()  # Celery's on_close: the broker delivers them again
    assert len(waiters) == 0 and waiters.info()["widened"] == 0 and semaphore.value == 1


def test_rabbitmq_order_only_on_queues_with_a_max_priority() -> None:
    level_of = level_function("amqp", {"q": 9})
    assert level_of is not None
    assert level_of(request(9)) == (0, "q") and level_of(request(None)) == (9, "q")
    assert level_of(request(9, "plain")) == (0, "plain") == level_of(request(1, "plain"))
    assert level_function("sqs", {}) is None


def test_an_unreadable_request_waits_at_the_first_level() -> None:
    semaphore, waiters, _ = ordered()
    semaphore.acquire(lambda *a: None)
    semaphore.acquire(lambda *a: None, object())
    assert waiters.info()["waiting"] == {"": {"0": 1}}


def app_with(**conf: Any) -> Celery:
    app = Celery("p", broker="redis://127.0.0.1:6379/0", set_as_current=False)
    app.conf.update(conf)
    return celery_extras.install(app)


def test_the_app_gets_ten_redis_levels_only_with_the_setting() -> None:
    assert app_with(extras_priority=True).conf.broker_transport_options == {"priority_steps": STEPS}
    assert "priority_steps" not in (app_with().conf.broker_transport_options or {})
    own = app_with(extras_priority=True, broker_transport_options={"priority_steps": [0, 5]})
    assert own.conf.broker_transport_options["priority_steps"] == [0, 5]  # the user's own
    late = Celery("late", broker="redis://127.0.0.1:6379/0", set_as_current=False)
    celery_extras.install(late)
    late.conf.extras_priority = True  # set after install: read when the app finalizes
    late.finalize()
    with late.connection_for_write() as connection:
        assert connection.default_channel.priority_steps == STEPS


def test_settings_are_checked() -> None:
    with pytest.raises(ImproperlyConfigured, match="extras_priority_aging: expected a number > 0"):
        settings_of(app_with(extras_priority_aging=0))
    with pytest.raises(ImproperlyConfigured, match="extras_priority: expected True or False"):
        settings_of(app_with(extras_priority="yes"))


class Worker:
    """What the step reads of a worker: its app, pool class and semaphore."""

    pool_cls = "prefork"

    def __init__(self, app: Celery, semaphore: Any) -> None:
        self.app = app
        self.semaphore = semaphore
        self.process_task = self._process_task_sem

    def _process_task_sem(self, req: Any) -> None:
        """Celery's: through the semaphore."""


def test_the_step_orders_the_semaphore_only_when_on() -> None:
    on = Worker(app_with(extras_priority=True, task_queue_max_priority=5), LaxBoundedSemaphore(2))
    step = PriorityStep(on)
    step.create(on)
    assert isinstance(on.semaphore._waiting, PriorityWaiters)
    assert step.info(on)["extras_priority"]["at_dispatch"] is True
    assert max_priorities(on.app) == {"celery": 5}
    off = Worker(app_with(), LaxBoundedSemaphore(2))
    step = PriorityStep(off)
    step.create(off)
    assert not isinstance(off.semaphore._waiting, PriorityWaiters) and step.info(off) == {}
    threads = Worker(app_with(extras_priority=True), None)
    step = PriorityStep(threads)
    step.create(threads)
    assert step.info(threads)["extras_priority"]["at_dispatch"] is False


def test_the_docs_example_runs_as_written() -> None:
    """docs/priority.rst's Python block, on kombu's memory transport."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "priority.rst").read_text()
    (block,) = re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", page)
    app = Celery("proj", broker="memory://", set_as_current=False)
    celery_extras.install(app)
    names: dict[str, Any] = {"app": app, "__name__": "proj"}
    with shared_tasks_isolated():  # the page's task is shared: not the next apps'
        exec(compile("\n".join(line[4:] for line in block.splitlines()), "priority.rst",
                     "exec"), names)  # fmt: skip
    assert settings_of(app)["priority"] is True and settings_of(app)["priority_aging"] == 30.0
    assert app.conf.broker_transport_options["priority_steps"] == STEPS
    with app.connection_for_write() as connection:  # kombu's memory queues are the process'
        channel = connection.default_channel
        sent = iter(lambda: channel.basic_get("celery", no_ack=True), None)
        message = next(m for m in sent if m.headers["task"] == "proj.report")
        assert message.properties["priority"] == 0


def test_fair_queues_buffers_are_priority_ordered() -> None:
    from celery_extras.consumer.task_consumer import BUFFER_ATTR
    from celery_extras.priority.fair import PriorityQueueBuffers

    c = SimpleNamespace(app=app_with(extras_priority=True))
    PriorityQueueBuffers(c)
    buffer = getattr(c, BUFFER_ATTR)("celery")
    for tag, priority in [("nine", 9), ("none", None), ("five", 5), ("five-b", 5)]:
        buffer.append(SimpleNamespace(properties={"priority": priority}, tag=tag))
    assert [m.tag for m in buffer] == ["none", "five", "five-b", "nine"] and len(buffer) == 4
    assert buffer.popleft().tag == "none" and bool(buffer)
    buffer.clear()
    assert not buffer
    off = SimpleNamespace(app=app_with())
    PriorityQueueBuffers(off)
    assert not hasattr(off, BUFFER_ATTR)  # fair queues keep their deques
