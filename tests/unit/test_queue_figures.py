"""Queue figures' pure parts: the publish stamp, prefetched counts, top's rows, the merge."""

from __future__ import annotations

from types import SimpleNamespace

from celery_extras.stats import gauges
from celery_extras.stats.monitor import queue_rows
from celery_extras.stats.queue_stamp import PUBLISHED_HEADER, stamp_published
from celery_extras.stats.queue_step import buffered_by_queue


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


def test_the_cluster_takes_the_largest_depth_and_age_and_sums_what_workers_hold() -> None:
    queues = next(g for g in gauges.GAUGES if g.key == "queues")
    assert queues.merge is not None
    merged = queues.merge([
        {"q": {"depth": 25, "oldest": 2.0, "buffered": 1}, "r": {"buffered": 0}},
        {"q": {"depth": 24, "oldest": 2.5, "buffered": 2}},
    ])  # fmt: skip
    assert merged == {"q": {"depth": 25, "oldest": 2.5, "buffered": 3}, "r": {"buffered": 0}}
    assert queues.check({"q": {"depth": -1, "buffered": 0}}) is None
    assert queues.check({"q": {"depth": 1}}) is None  # buffered is always there
    assert queues.check({"q": {"depth": 1, "buffered": 0, "extra": 1}}) is None


def test_top_shows_each_queue_with_a_dash_where_the_age_is_unknown() -> None:
    queues = {
        "b\x1b": {"depth": 3, "buffered": 1},
        "a": {"depth": 25, "oldest": 2.04, "buffered": 0},
    }
    rows = queue_rows(queues, 20)
    assert rows == [
        "queues" + " " * 14 + "    depth    oldest  prefetched",
        "  a" + " " * 17 + "       25      2.0s           0",
        "  b\\x1b" + " " * 13 + "        3         -           1",
    ]
    assert queue_rows({}, 20) == []
