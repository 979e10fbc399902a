"""worker-throughput events: parse what follows the contract, refuse the rest, never crash."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from celery_extras.stats.listener import ClusterState
from celery_extras.stats.recorder import COUNTERS
from celery_extras.stats.schema import MAX_TASKS, Malformed, parse


def good_event(hostname: str = "w1@h") -> dict[str, Any]:
    task = {c: [1, 2] for c in COUNTERS}
    task["runtime"] = {"count": 2, "sum": 0.5, "max": 0.4, "p50": 0.1, "p95": 0.4, "p99": None}
    return {
        "type": "worker-throughput",
        "hostname": hostname,
        "timestamp": 1700000000.5,
        "windows": [1, 10],
        "tasks": {"a": task},
    }


def test_a_contract_event_parses() -> None:
    figures = parse(good_event())
    assert figures.hostname == "w1@h"
    assert figures.windows == (1, 10)
    assert figures.tasks["a"].counts["retried"] == (1, 2)
    assert figures.tasks["a"].runtime["p99"] is None


def broken(path: list[Any], value: Any, delete: bool = False) -> dict[str, Any]:
    event = copy.deepcopy(good_event())
    target = event
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return event


BAD = [
    broken(["windows"], None, delete=True),
    broken(["tasks"], None, delete=True),
    broken(["hostname"], None, delete=True),
    broken(["timestamp"], "yesterday"),
    broken(["windows"], "1,10"),
    broken(["windows"], [1, "10"]),
    broken(["windows"], [1, -10]),
    broken(["windows"], list(range(1, 100))),
    broken(["tasks"], [1, 2]),
    broken(["tasks", "a"], "many"),
    broken(["tasks", "a", "failed"], [1]),
    broken(["tasks", "a", "failed"], [1, -2]),
    broken(["tasks", "a", "failed"], [1, True]),
    broken(["tasks", "a", "failed"], [1, 2.5]),
    broken(["tasks", "a", "revoked"], None, delete=True),
    broken(["tasks", "a", "runtime"], None, delete=True),
    broken(["tasks", "a", "runtime", "p95"], "fast"),
    broken(["tasks", "a", "runtime", "sum"], float("nan")),
    broken(["tasks", "a", "runtime", "count"], None),
    broken(["tasks"], {f"t{i}": {} for i in range(MAX_TASKS + 1)}),
    broken(["tasks"], {"x" * 10_000: {}}),
]


@pytest.mark.parametrize("event", BAD)
def test_malformed_events_are_refused_with_a_reason(event: dict[str, Any]) -> None:
    with pytest.raises(Malformed):
        parse(event)


def test_the_state_counts_malformed_events_and_logs_once_per_sender(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = ClusterState(clock=lambda: 100.0)
    for event in BAD:
        state.on_event(event)
    state.on_event("not even a dict")
    state.on_event({"type": "worker-throughput"})
    state.on_event(good_event("w2@h"))
    state.on_event({"type": "worker-heartbeat", "hostname": "w3@h"})  # not ours: ignored
    assert state.malformed == len(BAD) + 1
    assert state.received == 1
    assert list(state.workers()) == ["w2@h"]
    warnings = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warnings) == 2  # one for w1@h, one for events without a hostname
    state.on_event({"type": "worker-offline", "hostname": "w2@h"})
    assert state.workers() == {}


def test_silent_workers_age_out_of_the_view() -> None:
    now = [100.0]
    state = ClusterState(clock=lambda: now[0])
    state.on_event(good_event("w1@h"))
    now[0] = 150.0
    state.on_event(good_event("w2@h"))
    assert list(state.workers(max_age=30)) == ["w2@h"]
    assert list(state.workers()) == ["w1@h", "w2@h"]


def test_an_event_of_an_older_worker_parses_with_the_later_counters_at_zero() -> None:
    event = good_event()
    for counter in ("ignored", "parked", "released", "concurrency_limited"):
        del event["tasks"]["a"][counter]
    figures = parse(event)
    assert figures.tasks["a"].counts["parked"] == (0, 0)
    assert figures.tasks["a"].totals is None and figures.tasks["a"].runtime_total is None
    assert figures.state == {}


def test_totals_runtime_buckets_and_state_parse() -> None:
    event = good_event()
    event["runtime_scale"] = {"per_octave": 16, "low_exp": -20, "high_exp": 14}
    event["tasks"]["a"]["total"] = {c: 3 for c in COUNTERS}
    event["tasks"]["a"]["runtime_total"] = {"count": 3, "sum": 0.3, "buckets": [[0, 1], [544, 2]]}
    event["extras_state"] = {
        "store": {"policies": "ok", "sync": "down"},
        "waiting": 4,
        "parked": 7,
        "buffered": {"q1": 2},
    }
    figures = parse(event)
    task = figures.tasks["a"]
    assert task.totals == {c: 3 for c in COUNTERS}
    assert task.runtime_total is not None
    assert task.runtime_total.buckets == {2.0 ** (-20 + 1 / 16): 1, float("inf"): 2}
    assert figures.state == event["extras_state"]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["tasks", "a", "total"], {"received": -1}),
        (["tasks", "a", "total"], [1]),
        (["tasks", "a", "runtime_total"], {"count": 2, "sum": 0.1, "buckets": [[0, 1]]}),
        (["tasks", "a", "runtime_total"], {"count": 1, "sum": 0.1, "buckets": [[9999, 1]]}),
        (["tasks", "a", "runtime_total"], {"count": 1, "sum": "x", "buckets": [[0, 1]]}),
        (["runtime_scale"], {"per_octave": 10**9, "low_exp": -20, "high_exp": 14}),
        (["extras_state"], {"waiting": -1}),
        (["extras_state"], {"store": {"policies": 3}}),
        (["extras_state"], {"buffered": {"q": "many"}}),
        (["extras_state"], "ok"),
    ],
)
def test_bad_added_fields_are_malformed(path: list[Any], value: Any) -> None:
    with pytest.raises(Malformed):
        parse(broken(path, value))


def test_concurrency_gauges_parse_and_reach_prometheus() -> None:
    from celery_extras.stats.emitter import worker_state
    from celery_extras.stats.prometheus import ThroughputCollector

    infos = {"extras_policies": {"concurrency": {"tasks": {
        "t.a": {"n": 2, "scope": "global", "cap": 2, "holding": 2, "waiting": 5},
        "t.b": {"n": 1, "holding": "x", "waiting": 0},  # not counts: left out
    }}}}  # fmt: skip
    state_gauges = worker_state(infos)
    assert state_gauges == {"concurrency": {"t.a": {"holding": 2, "waiting": 5}}}
    event = good_event()
    event["extras_state"] = state_gauges
    assert parse(event).state == state_gauges
    state = ClusterState(clock=lambda: 100.0)
    state.on_event(event)
    families = {f.name: f for f in ThroughputCollector(state).collect()}
    for family, value in (("celery_extras_concurrency_holding", 2.0),
                          ("celery_extras_concurrency_waiting", 5.0)):  # fmt: skip
        [sample] = families[family].samples
        assert sample.labels == {"worker": "w1@h", "task": "t.a"} and sample.value == value


@pytest.mark.parametrize(
    "value",
    [{"t": {"holding": -1, "waiting": 0}}, {"t": {"holding": 1}}, {"": {"holding": 1,
     "waiting": 1}}, ["t"], {"t": 3}],
)  # fmt: skip
def test_bad_concurrency_gauges_are_malformed(value: Any) -> None:
    with pytest.raises(Malformed):
        parse(broken(["extras_state"], {"concurrency": value}))


OK_LIMIT = {"held": 1, "shadow": 0, "shadow_wait": 0.0}


@pytest.mark.parametrize(
    "value",
    [{"t": {"5/s": {**OK_LIMIT, "held": -1}}}, {"t": {"5/s": {"held": 1, "shadow": 0}}},
     {"t": {"5/s": {**OK_LIMIT, "shadow_wait": float("nan")}}}, {"t": {"": OK_LIMIT}},
     {"t": {"5/s": {**OK_LIMIT, "shadow": True}}}, {"t": {f"{i}/s": OK_LIMIT for i in range(65)}},
     {"t": ["5/s"]}, ["t"], {"x" * 501: {"5/s": OK_LIMIT}}],
)  # fmt: skip
def test_bad_limit_gauges_are_malformed(value: Any) -> None:
    assert parse(broken(["extras_state"], {"limits": {"t": {"5/s": OK_LIMIT}}}))
    with pytest.raises(Malformed):
        parse(broken(["extras_state"], {"limits": value}))


def test_the_eviction_gauge_parses_and_reaches_prometheus() -> None:
    from celery_extras.stats.emitter import worker_state
    from celery_extras.stats.prometheus import ThroughputCollector

    store = {"policy": "allkeys-lru", "maxmemory": 3 << 20, "parking": "refused"}
    infos = {"extras_store": {**store, "at_risk": ["parked tasks", "revokes"]}}
    state_gauges = worker_state(infos)
    assert state_gauges == {"eviction": {"policy": "allkeys-lru",
                                         "at_risk": ["parked tasks", "revokes"]}}  # fmt: skip
    event = good_event()
    event["extras_state"] = state_gauges
    assert parse(event).state == state_gauges
    state = ClusterState(clock=lambda: 100.0)
    state.on_event(event)
    families = {f.name: f for f in ThroughputCollector(state).collect()}
    [sample] = families["celery_extras_store_evictable"].samples
    assert sample.labels == {"worker": "w1@h", "policy": "allkeys-lru"} and sample.value == 2.0


@pytest.mark.parametrize(
    "value",
    [{"policy": "x" * 10_000, "at_risk": []}, {"policy": "noeviction"}, {"at_risk": []},
     {"policy": "allkeys-lru", "at_risk": "parked tasks"}, {"policy": 3, "at_risk": []},
     {"policy": "p", "at_risk": ["r"] * 1000}, {"policy": "p", "at_risk": [None]}, "allkeys"],
)  # fmt: skip
def test_bad_eviction_gauges_are_malformed(value: Any) -> None:
    with pytest.raises(Malformed):
        parse(broken(["extras_state"], {"eviction": value}))
