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
DOUBLED, SLOW, FAILING, RETRYING, ODD, UNPICKLABLE, HUGE, MIXED = (
    f"tests.batch.{n}"
    for n in ("doubled", "slow", "failing", "retrying", "odd", "unpicklable", "huge", "mixed")
)


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


def test_bad_results_fail_their_calls_alone_and_a_batch_sends_its_signals(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """Issue 51: an item JSON cannot encode fails its call alone with ``EncodeError``, the
    others succeed, none is left PENDING; with ``acks_late`` and ``reject_on_worker_lost``,
    a result the prefork pool cannot send back fails each call once (it is no lost worker,
    so no requeue, no rerun); ``task_prerun``/``task_postrun`` are sent once per batch with
    its request, and ``current_task`` is the task inside its body."""
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1", concurrency=2)
    odd = [send(ODD, tag) for tag in (1, "bad", 3, 4)]
    outcomes = [(r.get(timeout=30, propagate=False), r.state) for r in odd]
    assert [o for i, o in enumerate(outcomes) if i != 1] == [(1, "SUCCESS"), (3, "SUCCESS"),
                                                             (4, "SUCCESS")]  # fmt: skip
    assert outcomes[1][1] == "FAILURE" and type(outcomes[1][0]).__name__ == "EncodeError"
    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=10).stats()
    totals = stats[worker.hostname]["extras"]["tasks"][ODD]["total"]
    assert (totals["batched"], totals["succeeded"], totals["failed"]) == (1, 3, 1), totals

    lost = [send(UNPICKLABLE, i) for i in range(3)]
    for result in lost:
        with pytest.raises(Exception, match=r"(?i)pickle") as failed:
            result.get(timeout=30)
        assert type(failed.value).__name__ == "MaybeEncodingError"
    time.sleep(1.5)  # a requeued batch would run again within its wait (0.5 s)
    assert len(batches(journal, UNPICKLABLE)) == 1

    phases = {e["phase"]: e for e in batches(journal, ODD)}
    body, prerun, postrun = phases["body"], phases["prerun"], phases["postrun"]
    assert body["id"].startswith("batch-") and body["current"] == ODD
    assert prerun["task_id"] == postrun["task_id"] == body["id"] == prerun["id"]
    assert prerun["ids"] == body["ids"] and postrun["state"] == "SUCCESS"
    assert len(batches(journal, ODD)) == 3  # each sent once


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_batch_of_two_thousand_calls_never_keeps_the_worker_from_answering_pings(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """Issue 51: the calls of a huge batch end in slices between turns of the worker's
    loop, so a ping every 0.2 s while they end is answered within 0.5 s, every time (one
    go at ~1.2 ms a call kept it silent for seconds); every result is right."""
    cluster.configure(include=INCLUDE)
    began = time.monotonic()
    results = [send(HUGE, i) for i in range(2000)]  # queued before the worker starts
    worker = cluster.worker("w1", concurrency=2)
    started = time.monotonic()
    wait_for(lambda: batches(journal, HUGE), timeout=60, what="the batch of 2,000")
    ran = time.monotonic()
    waits: list[float | None] = []
    deadline = time.monotonic() + 40
    while not (results[0].ready() and results[-1].ready()) and time.monotonic() < deadline:
        asked = time.monotonic()
        replies = cluster.app.control.ping(destination=[worker.hostname], timeout=0.5)
        waits.append(time.monotonic() - asked if replies else None)
        time.sleep(max(0.0, 0.2 - (time.monotonic() - asked)))
    answered = [w for w in waits if w is not None]
    print(
        f"sent and started in {started - began:.1f} s, ran {ran - started:.1f} s later, "
        f"ended in {time.monotonic() - ran:.1f} s; {len(waits)} pings while the calls "
        f"ended, {len(answered)} answered, slowest {max(answered, default=0.0):.3f} s"
    )
    # each within the ping's timeout (0.5 s), as measured here too (0.1 s for the client)
    assert waits and None not in waits and max(answered) <= 0.6, waits
    assert [r.get(timeout=30) for r in results] == list(range(2000))
    (one,) = batches(journal, HUGE)
    assert one["n"] == 2000


def test_per_call_outcomes_fail_one_call_and_retry_another_alone(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """Issue 51: a batch of 5 returning ``[1, ValueError(), 3, Call.retry(...), 5]`` gives
    3 successes, 1 failure and 1 call retried alone (its own message, one more retry), which
    then succeeds in a batch of its own; on both brokers."""
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1", concurrency=2)
    results = [send(MIXED, tag) for tag in (1, "bad", 3, "again", 5)]
    outcomes = [(r.get(timeout=60, propagate=False), r.state) for r in results]
    assert [o for i, o in enumerate(outcomes) if i != 1] == [
        (1, "SUCCESS"), (3, "SUCCESS"), ("again", "SUCCESS"), (5, "SUCCESS")
    ]  # fmt: skip
    assert outcomes[1][1] == "FAILURE"
    assert repr(outcomes[1][0]) == "ValueError('bad document in a batch of 5')"
    runs = batches(journal, MIXED)
    assert [(e["n"], e["tags"], e["retries"]) for e in runs] == [
        (5, [1, "bad", 3, "again", 5], [0] * 5), (1, ["again"], [1])
    ]  # fmt: skip
    assert runs[1]["ids"] == [results[3].id]  # the same call, as its own message
    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=10).stats()
    batched = stats[worker.hostname]["extras_policies"]["batch"]
    print(f"batch counts: {batched}")
    assert {k: batched[k] for k in ("batches", "calls", "succeeded", "failed", "retried")} == {
        "batches": 2, "calls": 6, "succeeded": 4, "failed": 1, "retried": 1
    }  # fmt: skip
