"""Concurrency limits on real prefork workers, on Redis and on RabbitMQ (store: Redis).

Every run journals its start and its end (written by the pool processes on the one
host clock), so "never more than n at once" is checked from the stamps themselves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from celery_extras.concurrency.redis_slots import RedisSlots
from celery_extras.store.client import redis_client, store_key
from tests.integration.conftest import (
    RESTORE_AFTER_8S,
    Cluster,
    also_on_redis_cluster,
    wait_until_unacked_due,
)
from tests.support import proj
from tests.support.journal import Journal
from tests.support.outages import store_outages
from tests.support.workers import ROOT, WorkerProcess, wait_for

INCLUDE = ("tests.support.tasks_concurrency",)
GLOBAL2 = "tests.concurrency.global2"


def ends(journal: Journal, task: str) -> list[dict[str, Any]]:
    return [e for e in journal.entries() if e["task"] == task and e.get("phase") == "end"]


def most_at_once(intervals: Iterable[tuple[float, float]]) -> int:
    """The largest number of *intervals* open at one instant (an end before a start)."""
    pairs = list(intervals)
    events = sorted([(s, 1) for s, _ in pairs] + [(e, -1) for _, e in pairs])
    running = peak = 0
    for _t, step in events:
        running += step
        peak = max(peak, running)
    return peak


def start_workers(cluster: Cluster, names: Iterable[str], concurrency: int) -> list[WorkerProcess]:
    workers = [cluster.worker(n, concurrency=concurrency, start=False) for n in names]
    for worker in workers:
        worker.start(wait=False)
    for worker in workers:
        worker.wait_ready()
    return workers


def slots_info(cluster: Cluster, worker: WorkerProcess) -> dict[str, Any]:
    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=2).stats() or {}
    info: dict[str, Any] = stats.get(worker.hostname, {}).get("extras_policies", {})
    return info.get("concurrency", {})


def test_cap_across_three_workers(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    workers = start_workers(cluster, ("w1", "w2", "w3"), concurrency=3)
    for i in range(60):
        send(GLOBAL2, i)
    wait_for(lambda: len(ends(journal, GLOBAL2)) >= 10, timeout=30, what="10 runs")
    waiting = {w.hostname: slots_info(cluster, w) for w in workers}
    sent = time.time()
    send("tests.noop", "unlimited")  # not limited: must not wait behind the limited ones
    noop = wait_for(
        lambda: [e for e in journal.entries() if e["task"] == "tests.noop"], timeout=30
    )[0]
    wait_for(lambda: len(ends(journal, GLOBAL2)) >= 60, timeout=90, interval=0.2,
             what="60 runs")  # fmt: skip

    runs = ends(journal, GLOBAL2)
    assert sorted(e["tag"] for e in runs) == list(range(60))  # each exactly once
    assert most_at_once((e["start"], e["t"]) for e in runs) == 2
    assert len({e["worker"] for e in runs}) == 3  # shared by all, no worker starved
    elapsed = max(e["t"] for e in runs) - min(e["start"] for e in runs)
    throughput = 60 / elapsed
    starts_, ends_ = sorted(e["start"] for e in runs), sorted(e["t"] for e in runs)
    handoffs = sorted(starts_[i] - ends_[i - 2] for i in range(2, 60))  # slot idle between runs
    print(f"\nslot idle between runs: p50 {handoffs[29]:.3f} s, p95 {handoffs[55]:.3f} s, "
          f"total {sum(handoffs):.2f} s")  # fmt: skip
    print(f"\nconcurrency(2) x 0.2 s, 60 tasks on 3 workers: {throughput:.2f}/s (ideal 10/s), "
          f"unlimited task done {noop['t'] - sent:.2f} s after sending")  # fmt: skip
    assert throughput >= 9.0, f"{throughput:.2f}/s, 90% of the ideal 10/s is 9/s"
    assert noop["t"] - sent <= 2.0
    # inspect stats: holders and waiters per task, and the stats counter
    for info in waiting.values():
        entry = info["tasks"][GLOBAL2]
        assert entry["n"] == 2 and entry["scope"] == "global"
        assert {"holding", "waiting"} <= set(entry)
    assert sum(i["tasks"][GLOBAL2]["holding"] for i in waiting.values()) <= 2
    limited = 0
    for worker in workers:
        stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=2).stats()
        extras = (stats or {})[worker.hostname]["extras"]
        limited += extras["tasks"].get(GLOBAL2, {}).get("concurrency_limited", [0])[-1]
    assert limited >= 1


@also_on_redis_cluster("redis")
def test_per_key_slots_run_keys_in_parallel_and_each_key_serially(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    start_workers(cluster, ("w1", "w2"), concurrency=3)
    name = "tests.concurrency.per_key1"
    for i in range(4):
        for customer in ("a", "b", "c"):
            send(name, customer, f"{customer}{i}")
    wait_for(lambda: len(ends(journal, name)) >= 12, timeout=60, interval=0.2, what="12 runs")
    runs = ends(journal, name)
    assert sorted(e["tag"] for e in runs) == sorted(f"{c}{i}" for c in "abc" for i in range(4))
    for customer in "abc":
        assert most_at_once((e["start"], e["t"]) for e in runs if e["customer"] == customer) == 1
    assert most_at_once((e["start"], e["t"]) for e in runs) == 3  # the keys ran side by side
    for worker in cluster.workers:
        assert "release notices lost" not in worker.log()


def test_sigkill_of_the_holder_returns_its_slots_after_the_lease(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(
        include=INCLUDE,
        broker_transport_options=dict(RESTORE_AFTER_8S),
    )
    name, lease = "tests.concurrency.crash2", 3.0
    w1 = cluster.worker("w1", concurrency=3)
    for _ in range(2):
        send(name, "block")  # hold both slots until the flag is raised
    starts = lambda: [e for e in journal.entries() if e.get("phase") == "start"]  # noqa: E731
    wait_for(lambda: len(starts()) >= 2, timeout=30, what="w1 to hold both slots")
    w2 = cluster.worker("w2", concurrency=3)
    for i in range(6):
        send(name, i)
    wait_for(lambda: slots_info(cluster, w2).get("waiting", 0) >= 1, timeout=30,
             what="a task waiting for a slot on w2")  # fmt: skip
    killed_at = time.time()
    w1.kill()
    journal.raise_flag("go")  # the blocked runs, delivered again, now finish

    if wait_until_unacked_due(cluster):
        cluster.worker("w3", concurrency=3)  # kombu < 5.7 restores them as a worker starts
    everything = {"block", *range(6)}
    wait_for(lambda: {e["tag"] for e in ends(journal, name)} >= everything, timeout=90,
             interval=0.5, what="every task to run after the SIGKILL")  # fmt: skip
    entries = journal.entries()
    first_after = min(
        e["start"] for e in entries
        if e.get("phase") == "end" and e["worker"] == w2.hostname and e["start"] > killed_at
    )  # fmt: skip
    print(f"\nslots of the killed worker back after {first_after - killed_at:.2f} s "
          f"(lease {lease} s)")  # fmt: skip
    assert first_after - killed_at <= lease + 1.0
    done = {(e["id"], e["start"]) for e in entries if e.get("phase") == "end"}
    intervals = [(e["start"], e["t"]) for e in entries if e.get("phase") == "end"]
    intervals += [  # runs killed with w1: open until the kill
        (e["t"], killed_at) for e in entries
        if e.get("phase") == "start" and e["worker"] == w1.hostname
        and not any(i == e["id"] and abs(s - e["t"]) < 0.05 for i, s in done)
    ]  # fmt: skip
    assert most_at_once(intervals) <= 2


def test_every_ending_frees_the_slot(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """concurrency(1): each task runs only once the one before freed the slot, by its own
    ending (the renewal's safety net, "ended unseen", must not be what freed it)."""
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1", concurrency=3)
    name = "tests.concurrency.endings"

    def started(tag: str) -> bool:
        return any(e.get("tag") == tag and e.get("phase") == "start" for e in journal.entries())

    for how in ("fail", "retry", "reject", "ignore"):
        send(name, how, how)
    send(name, "sleep", "sleep", time_limit=1)  # killed by the hard time limit
    send(name, "ok", "ok")
    wait_for(lambda: started("ok"), timeout=30, what="the task after every ending")
    blocked = send(name, "block", "terminated")
    wait_for(lambda: started("terminated"), timeout=30)
    send(name, "ok", "after-terminate")
    cluster.app.control.revoke(blocked.id, terminate=True)
    wait_for(lambda: started("after-terminate"), timeout=30, what="the slot of a terminated task")
    send(name, "block", "blocker")
    wait_for(lambda: started("blocker"), timeout=30)
    waiting = send(name, "ok", "revoked-while-waiting")
    wait_for(lambda: slots_info(cluster, worker).get("waiting") == 1, timeout=30)
    cluster.app.control.revoke(waiting.id)
    send(name, "ok", "last")
    journal.raise_flag("go")
    wait_for(lambda: started("last"), timeout=30, what="the slot of a task revoked while waiting")
    assert not started("revoked-while-waiting")
    starts = [e["tag"] for e in journal.entries() if e.get("phase") == "start"]
    assert starts.count("retry") == 2  # the retry ran again, and freed the slot each time
    wait_for(lambda: slots_info(cluster, worker).get("holding") == 0, timeout=10)
    assert "ended unseen" not in worker.log()


def test_a_cap_far_from_binding_keeps_freed_slots_for_the_workers_next_runs(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """concurrency(1000, scope="global"), 200 queued tasks on one worker: a slot a run frees
    is kept for the worker's next run instead of going back to the store, and most runs
    take one unasked; once the worker has nothing left to run, and as it stops, the kept
    slots go back to the store."""
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1", concurrency=2)
    name = "tests.concurrency.roomy"
    slots = RedisSlots(redis_client(cluster.app), store_key(cluster.app))

    for i in range(200):
        send(name, i)
    wait_for(lambda: len(ends(journal, name)) >= 200, timeout=60, interval=0.2, what="200 runs")
    assert sorted(e["tag"] for e in ends(journal, name)) == list(range(200))
    info = slots_info(cluster, worker)
    assert info["admitted"] == 200 and info["reused"] >= 100, info
    wait_for(lambda: slots.holding(name) == 0 and slots_info(cluster, worker)["kept"] == 0,
             timeout=10, what="the kept slots freed")  # fmt: skip

    for i in range(200, 240):
        send(name, i)
    wait_for(lambda: len(ends(journal, name)) >= 240, timeout=60, interval=0.2, what="240 runs")
    worker.stop()
    assert slots.holding(name) == 0


def test_cli_changes_the_cap_on_every_worker_and_resets_it(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    workers = start_workers(cluster, ("w1", "w2"), concurrency=3)
    env = proj.worker_env(cluster.broker, cluster.ns, cluster.conf, cluster.include)

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.support.proj", "extras", *argv],
            cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def caps() -> set[int]:
        return {
            slots_info(cluster, w).get("tasks", {}).get(GLOBAL2, {}).get("cap") for w in workers
        }

    def run_batch(offset: int) -> int:
        for i in range(offset, offset + 10):
            send(GLOBAL2, i, 0.1)
        wait_for(lambda: len(ends(journal, GLOBAL2)) >= offset + 10, timeout=60)
        runs = [e for e in ends(journal, GLOBAL2) if offset <= e["tag"] < offset + 10]
        return most_at_once((e["start"], e["t"]) for e in runs)

    assert caps() == {2}
    done = cli("concurrency", GLOBAL2, "1")
    assert done.returncode == 0, done.stderr
    assert "at most 1 at once, stored" in done.stdout
    wait_for(lambda: caps() == {1}, timeout=10, what="every worker to apply the cap")
    assert run_batch(0) == 1
    assert cli("concurrency", GLOBAL2, "--reset").returncode == 0
    wait_for(lambda: caps() == {2}, timeout=10, what="every worker back to concurrency(2)")
    assert run_batch(10) == 2
    refused = cli("concurrency", GLOBAL2, "0")
    assert refused.returncode != 0 and "n 0: expected an int from 1 to 1000000" in refused.stderr


def test_store_unreachable_applies_the_cap_per_worker_and_logs_once(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE, extras_redis_url="redis://127.0.0.1:1/0")
    worker = cluster.worker("w1", concurrency=3)
    for i in range(8):
        send(GLOBAL2, i, 0.1)
    wait_for(lambda: len(ends(journal, GLOBAL2)) >= 8, timeout=60, what="8 runs")
    assert most_at_once((e["start"], e["t"]) for e in ends(journal, GLOBAL2)) == 2
    assert len(store_outages(worker.log(), "concurrency slots")) == 1
    assert "extras_concurrency_on_store_error='local'" in worker.log()


def test_a_task_under_every_store_gate_runs_each_message_once_within_its_cap(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """coalesce, a global limit and a global cap on one task: each arrival asks the three in
    one store round trip, each ending frees the hold and the slot in one."""
    cluster.configure(include=INCLUDE)
    workers = start_workers(cluster, ("w1", "w2"), concurrency=3)
    name = "tests.concurrency.all_gates"
    results = [send(name, f"k{i}", i) for i in range(40)]
    assert sorted(r.get(timeout=90) for r in results) == list(range(40))
    runs = ends(journal, name)
    assert sorted(e["tag"] for e in runs) == list(range(40))  # each exactly once
    assert most_at_once((e["start"], e["t"]) for e in runs) == 2
    wait_for(lambda: sum(slots_info(cluster, w)["tasks"][name]["holding"] for w in workers) == 0,
             timeout=30, what="every slot given back")  # fmt: skip
    for worker in workers:
        assert "store replies unread" not in worker.log()
        assert "Traceback" not in worker.log()
    # every arrival's round went on the worker's event loop without waiting: its line
    stats = cluster.app.control.inspect(timeout=5).stats() or {}
    lines = [stats[w.hostname]["extras_store_line"] for w in workers]
    assert sum(line["rounds"] for line in lines) >= 40  # 40 arrivals, and the covered ones
    assert all(line["writes"] <= line["rounds"] and line["failed"] == 0 for line in lines)
