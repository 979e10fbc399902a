"""A retry whose park is in doubt (the store's reply lost: it may hold the entry) is parked
again until the store answers, not published beside a stored copy (it ran twice); when the
store never answers within the patience, it is published: nothing is lost."""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery

import celery_extras
from celery_extras.delay.entry import Entry
from celery_extras.delay.parking import SETTLE_EVERY, Park, Parker
from celery_extras.retries.parking import SETTLE_PATIENCE, ParkingProducer
from tests.support.clock import FakeClock


class LosingStore:
    """Stores every park; the replies of the first *lost* parks are lost (a timeout)."""

    def __init__(self, lost: int) -> None:
        self.lost, self.parks, self.held = lost, 0, set[str]()

    def park(self, eid: str, entry: Entry, delay: float) -> bool:
        self.parks += 1
        new = eid not in self.held
        self.held.add(eid)
        if self.parks <= self.lost:
            raise redis.TimeoutError("Timeout reading from socket")
        return new


class Broker:
    def __init__(self) -> None:
        self.published: list[Any] = []

    def publish(self, body: Any, **kwargs: Any) -> None:
        self.published.append(body)


def parker_on(store: LosingStore, clock: FakeClock) -> Parker:
    app = celery_extras.install(Celery("doubt", set_as_current=False))
    parker = Parker(app, clock=clock)
    parker._store = store  # type: ignore[assignment]
    return parker


def retry_through(store: LosingStore) -> tuple[Broker, ParkingProducer, FakeClock]:
    clock = FakeClock()
    parker = parker_on(store, clock)
    broker = Broker()
    producer = ParkingProducer(broker, parker, "tasks.flaky", 60.0)

    def sleep(seconds: float) -> None:
        clock.now += seconds

    settle = parker.settle
    parker.settle = lambda *a, **k: settle(*a, **k, sleep=sleep)  # type: ignore[method-assign,misc]
    headers = {"id": "t1", "task": "tasks.flaky", "retries": 1}
    producer.publish([[1], {}, {}], headers=headers, serializer="json", routing_key="q")
    return broker, producer, clock


def test_a_retry_whose_park_is_in_doubt_is_parked_again_not_published() -> None:
    store = LosingStore(lost=3)  # stored at once; the store answers the fourth park
    broker, producer, _ = retry_through(store)
    assert producer.parked
    assert broker.published == []  # one copy: the store's
    assert store.parks == 4 and store.held == {next(iter(store.held))}


def test_a_retry_the_store_never_answers_for_is_published_after_the_patience() -> None:
    store = LosingStore(lost=10**6)
    broker, producer, clock = retry_through(store)
    assert not producer.parked
    assert len(broker.published) == 1  # it may run twice; it is not lost
    assert clock.now - 1000.0 >= SETTLE_PATIENCE


def test_settle_parks_again_every_half_second_until_the_store_answers() -> None:
    clock, store = FakeClock(), LosingStore(lost=6)
    parker = parker_on(store, clock)
    ticks: list[float] = []

    def sleep(seconds: float) -> None:
        ticks.append(seconds)
        clock.now += seconds

    entry = Entry(task="t", task_id="t1", kind="retry", body=b"[]", content_type="application/json",
                  content_encoding="utf-8", headers={}, properties={}, exchange="",
                  routing_key="q", queue="q")  # fmt: skip
    assert parker.settle("e1", entry, 5.0, patience=3.0, sleep=sleep) is Park.IN_DOUBT
    assert ticks == [SETTLE_EVERY] * 6 and store.parks == 6  # every reply lost, for 3 s
    assert parker.settle("e1", entry, 5.0, patience=3.0, sleep=sleep) is Park.PARKED
    assert store.parks == 7
