"""Queue figures' pure parts: the publish stamp, prefetched counts, top's rows, the merge."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import redis
from celery import Celery

import celery_extras
from celery_extras.stats import gauges
from celery_extras.stats.monitor import queue_rows
from celery_extras.stats.queue_stamp import PUBLISHED_HEADER, stamp_published
from celery_extras.stats.queue_step import (
    INFO_KEY,
    QueueFiguresStep,
    buffered_by_queue,
    parked_by_queue,
)


def test_every_publish_is_stamped_again() -> None:
    headers = {PUBLISHED_HEADER: 1.0}
    stamp_published(headers=headers, clock=lambda: 1234.56789, sender="any.task")
    assert headers == {PUBLISHED_HEADER: 1234.568}
    stamp_published(headers=None)  # nothing to stamp


def test_prefetched_requests_are_counted_by_their_queue_running_ones_not() -> None:
    class Request(SimpleNamespace):
        __hash__ = object.__hash__

    a1, a2, b1, other = (Request(delivery_info={"routing_key": k}) for k in ("ra", "ra", "rb", "x"))
    counts = buffered_by_queue({a1, a2, b1, other}, {a2}, {"ra": "a", "rb": "b"})
    assert counts == {"a": 1, "b": 1}


def test_the_store_counts_go_to_the_queue_a_routing_key_names() -> None:
    counts = {"a": 7, "rk-b": 3, "b": 1, "unknown": 5}
    assert parked_by_queue(counts, ["a", "b"], {"rk-b": "b", "a": "a"}) == {"a": 7, "b": 4}


def test_the_cluster_takes_the_largest_depth_and_age_and_sums_what_workers_hold() -> None:
    queues = next(g for g in gauges.GAUGES if g.key == "queues")
    assert queues.merge is not None
    merged = queues.merge([
        {"q": {"depth": 25, "oldest": 2.0, "parked": 7, "buffered": 1}, "r": {"buffered": 0}},
        {"q": {"depth": 24, "oldest": 2.5, "parked": 6, "buffered": 2}},
    ])  # fmt: skip
    assert merged == {"q": {"depth": 25, "oldest": 2.5, "parked": 7, "buffered": 3},
                      "r": {"buffered": 0}}  # fmt: skip
    assert queues.check({"q": {"parked": 3, "buffered": 0}}) == {"q": {"parked": 3, "buffered": 0}}
    assert queues.check({"q": {"parked": -1, "buffered": 0}}) is None
    assert queues.check({"q": {"parked": 1.5, "buffered": 0}}) is None
    assert queues.check({"q": {"depth": -1, "buffered": 0}}) is None
    assert queues.check({"q": {"depth": 1}}) is None  # buffered is always there
    assert queues.check({"q": {"depth": 1, "buffered": 0, "extra": 1}}) is None


def test_top_shows_each_queue_with_a_dash_where_the_age_is_unknown() -> None:
    queues = {
        "b\x1b": {"depth": 3, "buffered": 1},
        "a": {"depth": 25, "oldest": 2.04, "parked": 7, "buffered": 0},
    }
    rows = queue_rows(queues, 20)
    assert rows == [
        "queues" + " " * 14 + "    depth    oldest   parked  prefetched",
        "  a" + " " * 17 + "       25      2.0s        7           0",
        "  b\\x1b" + " " * 13 + "        3         -        -           1",
    ]
    assert queue_rows({}, 20) == []


class FakeStore:
    """The store's counts, one read per shard (two shards), or a failure."""

    def __init__(self, counts: dict[str, int] | None) -> None:
        self.counts = counts
        self.reads = 0

    def parked_by_queue(self) -> dict[str, int]:
        if self.counts is None:
            raise redis.ConnectionError("store down")
        self.reads += 2
        return dict(self.counts)

    def shards(self) -> tuple[str, ...]:
        return ("0", "2.0")


def test_the_step_reports_the_store_counts_per_queue_and_leaves_them_out_when_unread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = celery_extras.install(Celery("t", broker="memory://", set_as_current=False))
    step = QueueFiguresStep(SimpleNamespace(app=app))
    step.queues, step.routes = ["a", "b"], {"a": "a", "b": "b", "rk": "b"}
    step.figures = {"a": {"depth": 2}}
    assert step.info(None)[INFO_KEY]["queues"] == {"a": {"depth": 2, "buffered": 0},
                                                   "b": {"buffered": 0}}  # fmt: skip
    store = FakeStore({"a": 7, "rk": 3})
    step.read_parked(store)  # type: ignore[arg-type]
    info = step.info(None)[INFO_KEY]
    assert info["queues"] == {"a": {"depth": 2, "parked": 7, "buffered": 0},
                              "b": {"parked": 3, "buffered": 0}}  # fmt: skip
    assert info["store_reads"] == 2 == store.reads
    store.counts = None
    with caplog.at_level(logging.WARNING):
        step.read_parked(store)  # type: ignore[arg-type]
        step.read_parked(store)  # type: ignore[arg-type]
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if m.startswith("celery-extras: parked counts not read")] == said
    assert len(said) == 1
    assert step.info(None)[INFO_KEY]["queues"]["b"] == {"buffered": 0}
    store.counts = {}
    step.read_parked(store)  # type: ignore[arg-type]
    assert step.info(None)[INFO_KEY]["queues"]["b"] == {"parked": 0, "buffered": 0}
