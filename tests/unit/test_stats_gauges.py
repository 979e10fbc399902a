"""The gauge table: a gauge declared once reaches the event, its check, Prometheus and Flower."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from celery_extras.stats import gauges
from celery_extras.stats.emitter import worker_state
from celery_extras.stats.gauges import Family, Gauge
from celery_extras.stats.listener import LiveState
from celery_extras.stats.prometheus import ThroughputCollector
from celery_extras.stats.schema import Malformed, parse

INFOS: dict[str, Any] = {
    "extras_policies": {
        "store": "ok",
        "waiting": 4,
        "concurrency": {"tasks": {"t.a": {"n": 2, "holding": 2, "waiting": 1}}, "store": "ok"},
        "coalesce": {"tasks": {}, "store": "down"},  # each policy its row; "policies" the worst
        "by_limit": {
            "t.b": {
                "1: 100/s": {"held": 0, "shadow": 4, "shadow_wait": 1.5},
                "2: 5/s": {"held": 3, "shadow": 0, "shadow_wait": 0.0},
            }
        },
    },
    "extras_sync": {"store": "down"},
    "extras_delay": {"store": "ok", "depth": 7},
    "extras_store": {"policy": "allkeys-lru", "at_risk": ["parked tasks", "revokes"]},
    "extras_queues": {"buffered": {"q1": 2, "q\x1b": 3}},
    "extras_priority": {"waiting": {"q1": {"0": 1, "9": 4}}, "oldest_wait": 0.5},
    "extras_queue_figures": {
        "queues": {"q1": {"depth": 25, "oldest": 2.5, "buffered": 1}, "q2": {"buffered": 0}},
    },
}


def event(hostname: str, state: Any) -> dict[str, Any]:
    return {
        "type": "worker-throughput",
        "hostname": hostname,
        "timestamp": 1.0,
        "windows": [1, 10],
        "tasks": {},
        "extras_state": state,
    }


def outputs(*states: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Prometheus gauge samples ``{(family, labels): value}`` and Flower's page data."""
    from celery_extras.flower import page_data

    live = LiveState(clock=lambda: 100.0)
    for i, state in enumerate(states):
        live.on_event(event(f"w{i}@h", state))
    assert live.malformed == 0
    samples = {
        (family.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in ThroughputCollector(live).collect()
        for sample in family.samples
        if family.name != "celery_extras_worker_last_event_age_seconds"
    }
    return samples, page_data(live)


def test_every_gauge_goes_from_the_steps_to_the_event_prometheus_and_flower() -> None:
    state = worker_state(INFOS)
    assert state == {
        "store": {
            "policies": "down",
            "sync": "down",
            "delay": "ok",
            "limits": "ok",
            "concurrency": "ok",
            "coalesce": "down",
        },
        "eviction": {"policy": "allkeys-lru", "at_risk": ["parked tasks", "revokes"]},
        "waiting": 4,
        "parked": 7,
        "concurrency": {"t.a": {"holding": 2, "waiting": 1}},
        "limits": INFOS["extras_policies"]["by_limit"],
        "buffered": {"q1": 2, "q\x1b": 3},
        "priority": {"q1": {"0": 1, "9": 4}},
        # the fair consumer's 2 of q1 added to the 1 prefetched
        "queues": {"q1": {"depth": 25, "oldest": 2.5, "buffered": 3}, "q2": {"buffered": 0}},
    }
    assert list(state) == [g.key for g in gauges.GAUGES]  # the event's order is the table's
    assert parse(event("w@h", state)).state == state
    samples, data = outputs(state)
    w = (("worker", "w0@h"),)
    names = {family.name for gauge in gauges.GAUGES for family in gauge.families}
    assert {k: v for k, v in samples.items() if k[0] in names} == {
        ("celery_extras_store_up", (("capability", "policies"), *w)): 0.0,
        ("celery_extras_store_up", (("capability", "sync"), *w)): 0.0,
        ("celery_extras_store_up", (("capability", "delay"), *w)): 1.0,
        ("celery_extras_store_up", (("capability", "limits"), *w)): 1.0,
        ("celery_extras_store_up", (("capability", "concurrency"), *w)): 1.0,
        ("celery_extras_store_up", (("capability", "coalesce"), *w)): 0.0,
        ("celery_extras_store_evictable", (("policy", "allkeys-lru"), *w)): 2.0,
        ("celery_extras_tasks_waiting", w): 4.0,
        ("celery_extras_tasks_parked", w): 7.0,
        ("celery_extras_concurrency_holding", (("task", "t.a"), *w)): 2.0,
        ("celery_extras_concurrency_waiting", (("task", "t.a"), *w)): 1.0,
        ("celery_extras_queue_buffered", (("queue", "q1"), *w)): 2.0,
        ("celery_extras_queue_buffered", (("queue", "q\\x1b"), *w)): 3.0,
        ("celery_extras_priority_waiting", (("level", "0"), ("queue", "q1"), *w)): 1.0,
        ("celery_extras_priority_waiting", (("level", "9"), ("queue", "q1"), *w)): 4.0,
        ("celery_extras_queue_prefetched", (("queue", "q1"), *w)): 3.0,
        ("celery_extras_queue_prefetched", (("queue", "q2"), *w)): 0.0,
        **{
            (f"celery_extras_limit_{family}", (("limit", limit), ("task", "t.b"), *w)): value
            for family, limit, value in [
                ("held", "1: 100/s", 0.0),
                ("held", "2: 5/s", 3.0),
                ("shadow_held", "1: 100/s", 4.0),
                ("shadow_held", "2: 5/s", 0.0),
                ("shadow_wait_seconds", "1: 100/s", 1.5),
                ("shadow_wait_seconds", "2: 5/s", 0.0),
            ]
        },
    }
    assert data["workers"]["w0@h"]["gauges"] == [
        "store: policies down, sync down, delay ok, coalesce down",  # a policy: when not ok
        "store may evict parked tasks, revokes (maxmemory-policy allkeys-lru)",
        "waiting 4",
        "parked 7",
        "buffered 5",
        "prefetched 3",
    ]
    assert data["cluster"]["state"] == {"waiting": 4, "parked": 7, "queues": state["queues"]}
    # the queues' depth and age, cluster-wide: no worker label
    assert samples[("celery_extras_queue_depth", (("queue", "q1"),))] == 25.0
    assert samples[("celery_extras_queue_oldest_seconds", (("queue", "q1"),))] == 2.5
    assert ("celery_extras_queue_oldest_seconds", (("queue", "q2"),)) not in samples


def test_the_page_says_only_what_a_worker_has_and_the_cluster_merges_as_declared() -> None:
    quiet = {"eviction": {"policy": "noeviction", "at_risk": []}, "buffered": {"q": 0},
             "waiting": 0, "store": {}}  # fmt: skip
    busy = {"waiting": 3, "parked": 5, "store": {"sync\x07": "down\x1b"}}
    _, data = outputs(quiet, busy, {"parked": 9})
    assert data["workers"]["w0@h"]["gauges"] == ["waiting 0"]
    assert data["workers"]["w1@h"]["gauges"] == ["store: sync\\x07 down\\x1b", "waiting 3",
                                                 "parked 5"]  # fmt: skip
    assert data["cluster"]["state"] == {"waiting": 3, "parked": 9, "queues": {}}
    _, empty = outputs({})
    assert empty["cluster"]["state"] == {"waiting": 0, "parked": 0, "queues": {}}


WIDGETS = Gauge(
    key="widgets",
    read=lambda infos: (infos.get("extras_widgets") or {}).get("count"),
    check=lambda value: value if isinstance(value, int) and value >= 0 else None,
    expected="be an integer >= 0",
    families=(Family("celery_extras_widgets", "Widgets", ("kind",), lambda v: [(("b\x1b",), v)]),),
    page=lambda value: f"widgets {value}",
    merge=sum,
)


def test_a_gauge_added_to_the_table_appears_in_all_four_places(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gauges, "GAUGES", (*gauges.GAUGES, WIDGETS))
    state = worker_state({**INFOS, "extras_widgets": {"count": 3}})
    assert state["widgets"] == 3
    assert parse(event("w@h", state)).state["widgets"] == 3
    with pytest.raises(Malformed, match=r"extras_state\['widgets'\] must be an integer >= 0"):
        parse(event("w@h", {"widgets": -1}))
    samples, data = outputs(state, {"widgets": 4})
    assert samples[("celery_extras_widgets", (("kind", "b\\x1b"), ("worker", "w0@h")))] == 3
    assert samples[("celery_extras_widgets", (("kind", "b\\x1b"), ("worker", "w1@h")))] == 4
    assert data["workers"]["w0@h"]["gauges"][-1] == "widgets 3"
    assert data["workers"]["w1@h"]["gauges"] == ["widgets 4"]
    assert {k: v for k, v in data["cluster"]["state"].items() if k != "queues"} == {
        "waiting": 4,
        "parked": 7,
        "widgets": 7,
    }


def test_the_flower_page_lives_in_stats_and_the_public_line_still_imports() -> None:
    import celery_extras.flower as public
    import celery_extras.stats.flower as page

    assert public.in_flower is page.in_flower and public.page_data is page.page_data
    assert page._TEMPLATE.parent == Path(page.__file__).parent / "templates"
    assert "w.gauges" in page._TEMPLATE.read_text(encoding="utf-8")
