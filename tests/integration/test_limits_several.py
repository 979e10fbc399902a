"""Several limits on one task, cost and shadow mode on real prefork workers, on Redis and on
RabbitMQ (store: Redis).

Rates come from the journal's start times, written by the pool processes as each task
starts; with every task queued up front, a token bucket's starts are exact: between two
starts past the burst, the tokens taken divided by the time between them is the rate.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.integration.conftest import Cluster
from tests.integration.test_stats_cli import extras
from tests.support.journal import Journal
from tests.support.workers import wait_for

#: Rates are asserted here: under pytest-xdist these tests run alone.
pytestmark = pytest.mark.exclusive

INCLUDE = ("tests.support.tasks_limits",)


def runs(journal: Journal, task: str) -> list[dict[str, Any]]:
    return sorted((e for e in journal.entries() if e["task"] == task), key=lambda e: e["t"])


def rate(entries: Sequence[dict[str, Any]], skip: int, cost: Callable[[Any], int]) -> float:
    """Tokens per second between the start of entry *skip* (past the burst) and the last."""
    tokens = sum(cost(e) for e in entries[skip + 1 :])
    return tokens / (entries[-1]["t"] - entries[skip]["t"])


def one_each(entries: Sequence[dict[str, Any]]) -> int:
    return 1


def run_all(send: Callable[..., Any], task: str, calls: Sequence[tuple[Any, ...]]) -> None:
    results = [send(task, *args) for args in calls]
    for result in results:
        result.get(timeout=120)


def policies(cluster: Cluster, hostname: str) -> dict[str, Any]:
    stats = cluster.app.control.inspect(destination=[hostname], timeout=3).stats() or {}
    info: dict[str, Any] = stats.get(hostname, {}).get("extras_policies", {})
    return info


def extras_stats(cluster: Cluster, hostname: str, task: str) -> dict[str, int]:
    """The worker's stats counters of *task* over its longest window."""
    stats = cluster.app.control.inspect(destination=[hostname], timeout=3).stats() or {}
    figures = stats.get(hostname, {}).get("extras", {}).get("tasks", {}).get(task, {})
    return {name: counts[-1] for name, counts in figures.items() if isinstance(counts, list)}


@pytest.mark.scenario
def test_stacked_limits_hold_the_lower(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """5/s under 100/s: the task runs at 5/s, and stats say the 5/s limit held it."""
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1")
    run_all(send, "tests.limits.stacked", [(i,) for i in range(41)])
    entries = runs(journal, "tests.limits.stacked")
    assert sorted(e["tag"] for e in entries) == list(range(41))  # each exactly once
    assert 4.75 <= rate(entries, 1, one_each) <= 5.25
    held = policies(cluster, worker.hostname)["by_limit"]["tests.limits.stacked"]
    assert held["2: 5/s"]["held"] == 40 and held["1: 100/s"]["held"] == 0

    # a run-time rate names which of the two it is for
    done = extras(cluster, "limit", "tests.limits.stacked", "50/s")
    assert (
        done.returncode == 2
        and "tests.limits.stacked has 2 limit()s: name one with --limit N (1: 100/s, 2: 5/s)"
        in done.stderr
    ), done.stderr
    done = extras(cluster, "limit", "tests.limits.stacked", "50/s", "--limit", "2")
    assert done.returncode == 0, done.stderr
    assert f"{worker.hostname}: tests.limits.stacked#2: 50/s (burst 1, global)" in done.stdout
    shown = extras(cluster, "limit", "--show", "tests.limits.stacked").stdout
    assert "tests.limits.stacked: #1 limit(100/s, burst=1, scope=global); no stored rate" in shown
    assert "tests.limits.stacked: #2 limit(5/s, burst=1, scope=global); stored rate 50/s" in shown
    assert f"  {worker.hostname}: #2 50/s burst 1 (stored rate, global)" in shown, shown
    assert (
        extras(cluster, "limit", "--reset", "tests.limits.stacked", "--limit", "2").returncode == 0
    )


@pytest.mark.scenario
def test_a_global_limit_over_per_worker_limits_on_two_workers_holds_the_lower(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """10/s global over 2/s per worker, 2 workers: 4/s in all, 2/s on each."""
    cluster.configure(include=INCLUDE)
    for name in ("w1", "w2"):
        cluster.worker(name, start=False).start(wait=False)
    for worker in cluster.workers:
        worker.wait_ready()
    run_all(send, "tests.limits.mixed", [(i,) for i in range(42)])
    entries = runs(journal, "tests.limits.mixed")
    assert sorted(e["tag"] for e in entries) == list(range(42))
    per_worker = {
        w: [e for e in entries if e["worker"] == w] for w in {e["worker"] for e in entries}
    }
    assert len(per_worker) == 2
    rates = sorted(rate(mine, 1, one_each) for mine in per_worker.values())
    total = rate(entries, 2, one_each)  # both buckets start full: past both first starts
    assert rates[0] >= 1.9 and rates[-1] <= 2.1, rates  # each worker at its own limit
    assert 3.8 <= total <= 4.2, (rates, total)  # and the two at the sum of theirs


@pytest.mark.scenario
def test_a_cost_of_two_under_twenty_a_second_runs_ten_a_second(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    cluster.worker("w1")
    run_all(send, "tests.limits.double", [(i,) for i in range(61)])
    entries = runs(journal, "tests.limits.double")
    assert len(entries) == 61
    assert 9.5 <= rate(entries, 1, one_each) <= 10.5


@pytest.mark.scenario
def test_costs_drawn_from_one_to_five_take_the_rate_in_tokens(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    cluster.worker("w1")
    draw = random.Random(25)
    run_all(send, "tests.limits.costly", [(draw.randint(1, 5), i) for i in range(100)])
    entries = runs(journal, "tests.limits.costly")
    assert len(entries) == 100
    tokens_per_second = rate(entries, 5, lambda e: e["cost"])
    assert 19.0 <= tokens_per_second <= 21.0, tokens_per_second


def test_a_shadow_limit_never_delays_and_counts_what_a_real_one_holds(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1")
    run_all(send, "tests.limits.shadowed", [(i,) for i in range(30)])
    shadow = runs(journal, "tests.limits.shadowed")
    assert len(shadow) == 30
    assert shadow[-1]["t"] - shadow[0]["t"] < 2.0  # a real 5/s takes 5.8 s
    run_all(send, "tests.limits.unshadowed", [(i,) for i in range(30)])
    real = runs(journal, "tests.limits.unshadowed")
    assert real[-1]["t"] - real[0]["t"] >= 29 / 5 - 0.1

    shadow_counts = extras_stats(cluster, worker.hostname, "tests.limits.shadowed")
    real_counts = extras_stats(cluster, worker.hostname, "tests.limits.unshadowed")
    assert shadow_counts["shadow_limited"] == real_counts["rate_limited"] == 29
    assert shadow_counts["rate_limited"] == 0 and real_counts["shadow_limited"] == 0
    figures = policies(cluster, worker.hostname)["by_limit"]["tests.limits.shadowed"]["5/s"]
    assert figures["shadow"] == 29 and figures["held"] == 0
    # the waits a real 5/s would have imposed: 0.2 s, 0.4 s, ... less the time they took
    assert 29 * 30 / 2 * 0.2 - 29 * 2.0 <= figures["shadow_wait"] <= 29 * 30 / 2 * 0.2


@pytest.mark.scenario
def test_a_rate_for_one_key_holds_for_that_key_only_and_survives_a_restart(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    done = extras(cluster, "limit", "tests.limits.per_key", "10/s", "--key", "gold")
    assert done.returncode == 0, done.stderr
    assert "tests.limits.per_key for key 'gold': 10/s stored" in done.stdout
    shown = extras(cluster, "limit", "--show", "tests.limits.per_key")
    assert "  key 'gold': stored rate 10/s" in shown.stdout, shown.stdout

    for attempt in range(2):  # the second time on a worker started after the change
        worker = cluster.worker(f"w{attempt}")
        calls = [("gold", i) for i in range(31)] + [("basic", i) for i in range(9)]
        run_all(send, "tests.limits.per_key", calls)
        entries = runs(journal, "tests.limits.per_key")
        gold = [e for e in entries if e["customer"] == "gold"]
        basic = [e for e in entries if e["customer"] == "basic"]
        assert 9.5 <= rate(gold, 1, one_each) <= 10.5
        assert 1.9 <= rate(basic, 1, one_each) <= 2.1
        worker.stop()
        journal.clear()

    done = extras(cluster, "limit", "--reset", "tests.limits.per_key", "--key", "gold")
    assert done.returncode == 0, done.stderr
    shown = extras(cluster, "limit", "--show", "tests.limits.per_key")
    assert "key 'gold'" not in shown.stdout


def test_a_cost_above_the_burst_fails_that_task_only(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1")
    too_much, garbage, fine = (send("tests.limits.refusing", cost, tag)
                               for tag, cost in enumerate((3, "x", 2)))  # fmt: skip
    assert fine.get(timeout=60) == 2
    for result, why in ((too_much, "cost 3 is above the burst (2)"), (garbage, "cost 'x'")):
        wait_for(lambda r=result: r.state == "FAILURE", timeout=30, what="the refusal")
        assert "task tests.limits.refusing, limit() 10/s: " in str(result.result)
        assert why in str(result.result)
    assert [e["tag"] for e in runs(journal, "tests.limits.refusing")] == [2]
    assert policies(cluster, worker.hostname)["refused"] == 2
    assert worker.alive()
    assert worker.log().count("refused: task tests.limits.refusing, limit() 10/s: cost") == 2
