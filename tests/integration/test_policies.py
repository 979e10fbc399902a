"""Limits and retry policies on real workers, on Redis and on RabbitMQ (store: Redis).

Rates are measured from the journal's task start times (``t``), written by the
pool processes as each task starts.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from celery_extras import retry_memory
from celery_extras.limits.control import set_limit
from tests.integration.conftest import (
    RESTORE_AFTER_8S,
    Cluster,
    also_on_redis_cluster,
    wait_until_unacked_due,
)
from tests.support import proj, tasks_policies
from tests.support.journal import Journal
from tests.support.outages import store_outages
from tests.support.rates import JITTER, busiest_second, busiest_window, starts
from tests.support.workers import ROOT, WorkerProcess, wait_for

# Rates and latencies are asserted in most of these tests: under pytest-xdist they run alone
# (``exclusive``) or beside other scenarios only. Those whose outcome no neighbour's load can
# change (a failure, tasks kept through a SIGKILL or an outage, a wait's lower bound) run
# beside other tests.

INCLUDE = ("tests.support.tasks_policies",)


def steady_rate(times: Sequence[float], burst: int) -> float:
    """Tasks per second after the initial burst: (n - burst) / (last - first)."""
    return (len(times) - burst) / (times[-1] - times[0])


@pytest.mark.scenario
@also_on_redis_cluster("redis")
def test_global_limit_holds_across_three_workers(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    for name in ("w1", "w2", "w3"):
        cluster.worker(name, concurrency=2, start=False).start(wait=False)
    for worker in cluster.workers:
        worker.wait_ready()
    for i in range(400):
        send("tests.policies.global20", i)
    journal.wait_for_runs(400, timeout=90, what="400 global20 runs")

    times = starts(journal, "tests.policies.global20")
    entries = journal.entries()
    assert sorted(e["tag"] for e in entries) == list(range(400))  # each exactly once
    assert len({e["worker"] for e in entries}) == 3  # the limit is shared, not per worker
    rate = steady_rate(times, burst=2)
    assert 19.0 <= rate <= 21.0, f"achieved {rate:.2f}/s for 20/s"
    assert busiest_second(times) <= (20 + 2) * JITTER, busiest_window(times)


def booked_ahead(cluster: Cluster, hostname: str) -> int:
    """The calls *hostname* admitted on slots its limits booked ahead (``inspect stats``)."""
    stats = cluster.app.control.inspect([hostname], timeout=10).stats() or {}
    return int(stats[hostname]["extras_policies"]["booked_ahead"])


def drained_once(cluster: Cluster, send: Callable[..., Any], journal: Journal, task: str,
                 count: int) -> WorkerProcess:  # fmt: skip
    """*count* of *task* queued, then drained by one worker: each ran once. The worker."""
    cluster.configure(include=INCLUDE)
    for i in range(count):
        send(task, i)
    worker = cluster.worker("w1", concurrency=2)
    journal.wait_for_runs(count, timeout=120, what=f"{count} {task} runs")
    assert Counter(e["tag"] for e in journal.entries()) == Counter(range(count))  # each once
    return worker


@pytest.mark.exclusive
def test_a_global_limit_that_binds_books_hardly_any_ahead_and_is_never_passed(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """100/s, burst 1: a slot every 10 ms, two within the late tolerance of a booked slot
    (20 ms). One worker drains faster: the bucket hardly ever stands full (its tasks held
    and parked have booked its slots seconds ahead), so hardly a call is booked ahead
    (a call for every few tasks, as when it does not bind, would be hundreds), and the
    rate is never above 100/s.

    How far below is not asserted: on a loaded 2-core VM it came to 84/s with nothing
    booked ahead (CI, 2026-11-27; likely held tasks whose timers fired past the
    tolerance, their slots booked again); the busiest second neither: the pool's task
    starts bunch up to 115 in a second there, with nothing booked ahead."""
    worker = drained_once(cluster, send, journal, "tests.policies.global100", 600)
    times = starts(journal, "tests.policies.global100")
    rate, booked = steady_rate(times, burst=1), booked_ahead(cluster, worker.hostname)
    assert rate <= 101.0, f"achieved {rate:.2f}/s for 100/s ({booked} booked ahead)"
    assert booked < 30


@pytest.mark.exclusive
def test_a_global_limit_that_stands_idle_between_calls_books_them_ahead(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """5,000/s: one worker's drain leaves the bucket idle between its calls, which come
    faster than the late tolerance (20 ms): the store books the next ones with the one
    that goes now, and the worker spends them without asking; every task runs once."""
    worker = drained_once(cluster, send, journal, "tests.policies.global5000", 600)
    assert 150 <= booked_ahead(cluster, worker.hostname) < 600


@pytest.mark.scenario
@pytest.mark.exclusive  # a latency and a per-worker bucket: alone, not beside a scenario
def test_worker_limit_sustains_rate_and_lets_other_tasks_through(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    for i in range(200):
        send("tests.policies.worker10", i)
    cluster.worker("w1", concurrency=2)
    journal.wait_for_runs(30, timeout=30, what="the limited run to be under way")
    sent = time.time()
    send("tests.noop", "unlimited")
    wait_for(
        lambda: any(e["task"] == "tests.noop" for e in journal.entries()),
        timeout=10,
        what="the unlimited task",
    )
    journal.wait_for_runs(201, timeout=60, what="200 worker10 runs")

    entries = journal.entries()
    unlimited = next(e for e in entries if e["task"] == "tests.noop")
    assert unlimited["t"] - sent <= 0.5, (
        f"unlimited task started {unlimited['t'] - sent:.2f} s late"
    )
    times = starts(journal, "tests.policies.worker10")
    assert len(times) == 200
    rate = steady_rate(times, burst=1)
    assert 9.5 <= rate <= 10.5, f"achieved {rate:.2f}/s for 10/s"
    # no collapse: every 2-second stretch of the run keeps the rate (a start a little late
    # after the worker's cold start may shift one task into the next stretch)
    for k in range(int((times[-1] - times[0]) // 2)):
        lo = times[0] + 2 * k
        in_window = sum(1 for t in times if lo <= t < lo + 2)
        assert 18 <= in_window <= 22, f"{in_window} tasks in seconds {2 * k}-{2 * k + 2}"


@pytest.mark.exclusive
@also_on_redis_cluster("rabbitmq")
def test_per_key_buckets_run_side_by_side(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    for i in range(20):
        send("tests.policies.per_key", "alice", i)
        send("tests.policies.per_key", "bob", i)
    cluster.worker("w1", concurrency=2)
    journal.wait_for_runs(40, timeout=40, what="40 per_key runs")

    by_key: dict[str, list[float]] = defaultdict(list)
    for e in journal.entries():
        by_key[e["customer"]].append(e["t"])
    alice, bob = sorted(by_key["alice"]), sorted(by_key["bob"])
    assert len(alice) == len(bob) == 20
    for times in (alice, bob):
        assert 4.6 <= steady_rate(times, burst=1) <= 5.4
        assert busiest_second(times) <= 5 + 1
    assert abs(alice[0] - bob[0]) < 1.0 and abs(alice[-1] - bob[-1]) < 1.0  # concurrently
    both = sorted(alice + bob)
    assert 9.2 <= steady_rate(both, burst=2) <= 10.8


@pytest.mark.exclusive
@also_on_redis_cluster("redis")
def test_per_item_backoff_doubles_up_to_the_cap_and_success_forgets(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    cluster.worker("w1", concurrency=2)
    result = send("tests.policies.flaky", "item-1", 5)
    assert result.get(timeout=30) == 5

    runs = sorted(journal.entries(), key=lambda e: e["t"])
    assert [e["retries"] for e in runs] == [0, 1, 2, 3, 4, 5]
    assert [e["requeues"] for e in runs] == [0, 1, 2, 3, 4, 5]
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(runs)]
    for gap, expected in zip(gaps, [0.3, 0.6, 1.2, 1.5, 1.5], strict=True):
        assert expected <= gap <= expected + 0.5, f"gaps {gaps}"
    assert (
        retry_memory(cluster.app, "tests.policies.flaky", tasks_policies.BACKOFF).num_requeues(
            "item-1"
        )
        == 0
    )


@pytest.mark.exclusive
@also_on_redis_cluster("rabbitmq")
def test_failure_memory_is_shared_and_forgotten_across_workers(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    ns = cluster.ns
    w1 = cluster.worker("w1", queues=(ns,))
    w2 = cluster.worker("w2", queues=(f"{ns}.b",))
    memory = retry_memory(cluster.app, "tests.policies.flaky", tasks_policies.BACKOFF)

    first = send("tests.policies.flaky", "acct", 3, "first", queue=ns)
    wait_for(lambda: memory.num_requeues("acct") == 3, timeout=20, what="3 failures of acct")
    # w1 now waits 1.2 s before the next attempt; w2 sees the failures and its success forgets
    second = send("tests.policies.flaky", "acct", 0, "second", queue=f"{ns}.b")
    assert second.get(timeout=20) == 0
    assert first.get(timeout=20) == 3

    runs = sorted(journal.entries(), key=lambda e: e["t"])
    seen = [(e["tag"], e["worker"], e["requeues"]) for e in runs]
    assert seen == [
        ("first", w1.hostname, 0),
        ("first", w1.hostname, 1),
        ("first", w1.hostname, 2),
        ("second", w2.hostname, 3),
        ("first", w1.hostname, 0),  # forgotten by w2's success
    ]
    assert memory.num_requeues("acct") == 0


def test_exhausted_retries_fail_with_the_original_exception(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    cluster.worker("w1")
    result = send("tests.policies.exhaust", "x")
    with pytest.raises(KeyError, match="missing x"):
        result.get(timeout=20)
    assert [e["retries"] for e in journal.entries()] == [0, 1, 2]


def test_sigkill_while_tasks_wait_loses_none(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(
        include=INCLUDE,
        broker_transport_options=dict(RESTORE_AFTER_8S),
    )
    sent = [(name, send(f"tests.policies.{name}", i).id) for i in range(10)
            for name in ("kill_early", "kill_late")]  # fmt: skip
    early = [task_id for name, task_id in sent if name == "kill_early"]
    late = [task_id for name, task_id in sent if name == "kill_late"]
    w1 = cluster.worker("w1", concurrency=2)
    journal.wait_for_runs(4, timeout=30, what="the first limited runs")
    stats = cluster.app.control.inspect(destination=[w1.hostname], timeout=2).stats() or {}
    w1.kill()
    waited = stats[w1.hostname]["extras_policies"]
    assert waited["held"] + waited["parked"] > 0  # tasks were waiting when it died

    wait_until_unacked_due(cluster)  # w2 restores them as it starts
    # An early-ack task Celery's pool accepted (and acked) on w1 but did not start before
    # the SIGKILL is lost in plain Celery too; any other task must run.
    acked_on_w1 = set(early) & journal.marked("accepted")
    assert acked_on_w1  # the mark works: w1 ran some
    cluster.worker("w2", concurrency=2)

    def missing() -> set[str]:
        ran = {e["id"] for e in journal.entries()}
        return set(early + late) - ran - acked_on_w1

    wait_for(
        lambda: not missing(),
        timeout=60,
        interval=0.5,
        what=lambda: (
            f"every task to run after the SIGKILL; missing: {sorted(missing())} "
            f"(of late: {sorted(missing() & set(late))})"
        ),
    )


def test_store_unreachable_falls_back_to_local_and_logs_once(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE, extras_redis_url="redis://127.0.0.1:1/0")
    worker = cluster.worker("w1")
    results = [send("tests.policies.store_down", i) for i in range(7)]
    assert sorted(r.get(timeout=30) for r in results) == list(range(7))
    times = starts(journal, "tests.policies.store_down")
    assert times[-1] - times[0] >= 6 / 2 - 0.05  # 2/s applied locally: 7 runs take >= 3 s
    assert len(store_outages(worker.log(), "global limits")) == 1


def test_store_unreachable_delay_keeps_every_task(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(
        include=INCLUDE,
        extras_redis_url="redis://127.0.0.1:1/0",
        extras_limit_on_store_error="delay",
        extras_limit_store_retry=0.2,
    )
    worker = cluster.worker("w1")
    for i in range(5):
        send("tests.policies.store_down", i)
    wait_for(lambda: store_outages(worker.log(), "global limits"), timeout=20, what="the log")

    def waiting() -> Any:  # the 5 arrive one by one: the first log comes before the last
        stats = cluster.app.control.inspect(timeout=2).stats() or {}
        return stats.get(worker.hostname, {}).get("extras_policies", {}).get("waiting")

    wait_for(lambda: waiting() == 5, timeout=20, interval=0.5, what="5 tasks waiting")
    worker.stop()
    assert len(journal) == 0
    with cluster.app.connection_for_read() as conn:
        queued = conn.default_channel.queue_declare(cluster.ns, passive=True).message_count
    assert queued == 5  # handed back to the broker on shutdown, none lost
    assert len(store_outages(worker.log(), "global limits")) == 1


@pytest.mark.exclusive
@also_on_redis_cluster("redis")
def test_limit_changed_at_run_time_applies_now_and_to_later_workers(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    with pytest.raises(ValueError, match="rate 'fast'"):
        set_limit(cluster.app, "tests.policies.tunable", "fast")
    good = _cli(cluster, "extras", "limit", "tests.policies.tunable", "20/s")
    assert good.returncode == 0, good.stderr
    assert "tests.policies.tunable: 20/s stored" in good.stdout

    worker = cluster.worker("w1")  # started after the change: reads it from the store
    results = [send("tests.policies.tunable", i) for i in range(21)]
    assert sorted(r.get(timeout=30) for r in results) == list(range(21))
    times = starts(journal, "tests.policies.tunable")
    assert 17 <= steady_rate(times, burst=1) <= 21  # 20/s, not the decorated 1/s

    replies = set_limit(cluster.app, "tests.policies.tunable", "2/s", timeout=2)
    assert replies == [{worker.hostname: {"ok": "tests.policies.tunable: 2/s (burst 1, worker)"}}]
    journal.clear()
    results = [send("tests.policies.tunable", i) for i in range(5)]
    assert sorted(r.get(timeout=30) for r in results) == list(range(5))
    times = starts(journal, "tests.policies.tunable")
    assert times[-1] - times[0] >= 4 / 2 - 0.05
    info = cluster.app.control.inspect(timeout=2).stats()[worker.hostname]["extras_policies"]
    assert info["limits"]["tests.policies.tunable"]["override"] == "2/s"

    unknown = set_limit(cluster.app, "tests.noop", "2/s", timeout=2)
    assert unknown == [
        {worker.hostname: {"error": "task 'tests.noop' has no limit() on this worker"}}
    ]


def _cli(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    env = proj.worker_env(cluster.broker, cluster.ns, cluster.conf, cluster.include)
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.support.proj", *argv],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
