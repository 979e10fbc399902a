"""The close of the old event dispatcher's connection waits for the publish under way on it
(``EventsCloseGuard``, chaos seed 172743): on real RabbitMQ and Redis connections.

After a lost connection Celery's Events step closes the old dispatcher's connection while
Celery's heartbeat, under the dispatcher's mutex, may be publishing on it (connected again
by its retry, waiting for its exchange's ``declare-ok``); both read one socket, and a
gevent worker froze. ``python -m bench green_restarts`` counts the freezes."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

import celery_extras
from celery_extras.stats.emitter import EVENT_TYPE, StatsEmitter
from celery_extras.workarounds import EventsCloseGuard
from tests.support.brokers import require_broker

#: How long a close that must wait is given to (wrongly) finish
GRACE = 0.5


def _consumer(broker: str, hub: Any = None) -> SimpleNamespace:
    app = Celery("events-close", broker=require_broker(broker))
    dispatcher = app.events.Dispatcher(app.connection_for_write(), enabled=True)
    dispatcher.send("worker-heartbeat")  # connected, its exchange declared
    return SimpleNamespace(app=app, hub=hub, event_dispatcher=dispatcher)


def _close_in_thread(connection: Any) -> threading.Thread:
    closing = threading.Thread(target=connection.close, daemon=True)
    closing.start()
    return closing


def test_the_close_waits_for_a_publish_under_the_dispatchers_mutex_seed_172743() -> None:
    c = _consumer("rabbitmq")
    EventsCloseGuard(c).start(c)
    connection = c.event_dispatcher.connection
    with c.event_dispatcher.mutex:  # a heartbeat being published
        closing = _close_in_thread(connection)
        closing.join(GRACE)
        assert closing.is_alive(), "the close did not wait for the publish under way"
        assert connection.connected
    closing.join(10)
    assert not closing.is_alive()
    assert not connection.connected
    c.app.close()


def test_a_free_mutex_lets_the_close_run_at_once_and_frees_it_after() -> None:
    c = _consumer("rabbitmq")
    EventsCloseGuard(c).start(c)
    connection = c.event_dispatcher.connection
    connection.close()
    assert not connection.connected
    assert c.event_dispatcher.mutex.acquire(blocking=False)
    c.event_dispatcher.mutex.release()
    c.app.close()


@pytest.mark.parametrize(("broker", "hub"), [("redis", None), ("rabbitmq", object())])
def test_the_close_is_left_alone_on_redis_and_with_an_event_loop(broker: str, hub: Any) -> None:
    """A Redis channel's close waits for no answer; with an event loop (prefork, solo) the
    heartbeat runs in the consumer's own thread."""
    c = _consumer(broker, hub)
    EventsCloseGuard(c).start(c)
    connection = c.event_dispatcher.connection
    with c.event_dispatcher.mutex:
        closing = _close_in_thread(connection)
        closing.join(10)
        assert not closing.is_alive()
    c.app.close()


def test_the_stats_tick_is_skipped_while_a_publish_holds_the_dispatcher() -> None:
    """A heartbeat retrying its publish holds the dispatcher's mutex; the stats emitter's
    timer ticks skip rather than pile up one greenlet per tick behind it (a frozen worker
    of the probe had twelve)."""
    c = _consumer("rabbitmq")
    celery_extras.install(c.app)
    published: list[str] = []
    publish = c.event_dispatcher._publish

    def counted(event: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        published.append(event["type"])
        return publish(event, *args, **kwargs)

    c.event_dispatcher._publish = counted
    emitter = StatsEmitter(c)
    with c.event_dispatcher.mutex:
        ticking = threading.Thread(target=emitter.emit, args=(c,), daemon=True)
        ticking.start()
        ticking.join(10)
        assert not ticking.is_alive(), "the tick waited for the mutex"
    assert published == []
    emitter.emit(c)
    assert published == [EVENT_TYPE]
    c.app.close()
