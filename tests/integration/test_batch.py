"""Batching on real prefork workers (issue 36): full batches from a backlog, a partial one
after its wait, a worker SIGKILLed mid-batch, a chord of batched calls, a batch that raises
and one that retries. Each batch journals its calls; each caller's result is checked."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from celery import chord, signature

import tests.support.tasks_batch  # noqa: F401  (the producer knows the tasks by name too)
from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_batch",)
DOUBLED, SLOW, FAILING, RETRYING = (f"tests.batch.{n}" for n in
                                    ("doubled", "slow", "failing", "retrying"))  # fmt: skip


def batches(journal: Journal, task: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in journal.entries() if e["task"] == task
            and all(e.get(k) == v for k, v in match.items())]  # fmt: skip


def test_a_backlog_runs_in_full_batches_and_every_caller_gets_its_own_result(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    results = [send(DOUBLED, i) for i in range(200)]  # queued before the worker starts
    cluster.worker("w1", concurrency=2)
    assert [r.get(timeout=120) for r in results] == [2 * i for i in range(200)]
    sizes = [e["n"] for e in batches(journal, DOUBLED)]
    print(f"batch sizes: {sizes}")
    assert sum(sizes) == 200 and len(sizes) <= 6 and max(sizes) <= 50, sizes
    assert Counter(i for e in batches(journal, DOUBLED) for i in e["ids"]) == Counter(
        r.id for r in results
    )


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_seven_calls_then_nothing_run_as_one_batch_after_the_wait(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1", concurrency=2)
    sent = time.time()
    results = [send(DOUBLED, i) for i in range(7)]
    assert [r.get(timeout=60) for r in results] == [0, 2, 4, 6, 8, 10, 12]
    (one,) = batches(journal, DOUBLED)
    print(f"7 calls ran {one['start'] - sent:.2f} s after the first was sent (wait 2 s)")
    assert one["n"] == 7 and one["start"] - sent <= 2.0 + 0.5
    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=10).stats()
    totals = stats[worker.hostname]["extras"]["tasks"][DOUBLED]["total"]
    assert (totals["batched"], totals["succeeded"], totals["failed"]) == (1, 7, 0), totals


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_a_worker_killed_mid_batch_loses_nothing_and_runs_each_call_once(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    first = cluster.worker("w1", concurrency=2)
    results = [send(SLOW, i) for i in range(30)]
    wait_for(lambda: batches(journal, SLOW, phase="start"), timeout=60, what="the batch")
    first.kill()
    cluster.worker("w2", concurrency=2)
    assert sorted(r.get(timeout=120) for r in results) == list(range(30))
    done = Counter(i for e in batches(journal, SLOW, phase="done") for i in e["ids"])
    assert done == Counter(r.id for r in results)  # each of the 30 done exactly once


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_chord_of_forty_batched_calls_fires_with_every_part_counted(
    cluster: Cluster, journal: Journal
) -> None:
    app = cluster.configure(include=INCLUDE)
    cluster.worker("w1", concurrency=2)
    header = [signature(DOUBLED, args=(i,), app=app) for i in range(40)]
    result = chord(header)(signature("tests.batch.total", app=app))
    assert result.get(timeout=60) == 2 * sum(range(40))
    assert sum(e["n"] for e in batches(journal, DOUBLED)) == 40


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_batch_that_raises_fails_every_call_and_one_that_retries_runs_every_call_again(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    cluster.worker("w1", concurrency=2)
    failed = [send(FAILING, i) for i in range(4)]
    for result in failed:
        with pytest.raises(ValueError, match="boom in a batch of 4"):
            result.get(timeout=60)
    retried = [send(RETRYING, i) for i in range(4)]
    assert [r.get(timeout=60) for r in retried] == [0, 2, 4, 6]
    runs = batches(journal, RETRYING)
    assert [sorted(e["ids"]) for e in runs] == [sorted(r.id for r in retried)] * 2
    assert [e["retries"] for e in runs] == [[0] * 4, [1] * 4]


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_limit_gates_each_call_before_it_joins_a_batch(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """40 calls at 20/s (burst 1) reach the batch gate over about 2 s: batches of at most
    10 spread over that time, not one burst of four full batches."""
    cluster.configure(include=INCLUDE)
    cluster.worker("w1", concurrency=2)
    results = [send("tests.batch.limited", i) for i in range(40)]
    assert sorted(r.get(timeout=60) for r in results) == list(range(40))
    runs = batches(journal, "tests.batch.limited")
    starts = sorted(e["start"] for e in runs)
    print(f"batch sizes {[e['n'] for e in runs]}, spread {starts[-1] - starts[0]:.2f} s")
    assert sum(e["n"] for e in runs) == 40 and max(e["n"] for e in runs) <= 10
    # tokens 9 and 39 (the first and last batch full) come 1.5 s apart; unlimited, the four
    # batches would all start within a tenth of a second
    assert starts[-1] - starts[0] >= 1.0
