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
