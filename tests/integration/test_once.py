"""No body runs twice without a fault, on every pool and both brokers (``acks_late``).

A test that counts runs per key cannot see a body that ran twice under one task id: these
count bodies per id. One worker per pool (prefork ``-c 2``, threads, gevent and eventlet
``-c 8``) runs a task under each policy that covers, holds or gates a message: a coalesced
key whose run is under way when ten more of it arrive (the reproduction of the double run
on threads, gevent and eventlet: the waiting run woken from a pool's thread and from the
event loop at once), debounced bursts, a limit, a concurrency cap per key, batches. Every
caller's result must resolve, and the journal must hold each id's body once.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

import tests.support.tasks_once  # noqa: F401  (the producer stamps coalesced sends)
from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_once",)
COALESCED, DEBOUNCED = "tests.once.coalesced", "tests.once.debounced"
LIMITED, CAPPED, BATCHED = "tests.once.limited", "tests.once.capped", "tests.once.batched"
POOLS = {"prefork": 2, "solo": 1, "threads": 8, "gevent": 8, "eventlet": 8}


def starts(journal: Journal, task: str | None = None) -> list[dict[str, Any]]:
    return [e for e in journal.entries()
            if e.get("phase") == "start" and (task is None or e["task"] == task)]  # fmt: skip


def problems(log: str) -> list[str]:
    return [line for line in log.splitlines()
            if "ERROR/" in line or "CRITICAL/" in line or "Traceback" in line]  # fmt: skip


@pytest.mark.parametrize("pool", list(POOLS))
def test_no_body_runs_twice_under_any_policy(cluster: Cluster, journal: Journal, pool: str) -> None:
    cluster.configure(include=INCLUDE, task_acks_late=True)
    worker = cluster.worker(f"{pool}1", concurrency=POOLS[pool], pool=pool)
    results: list[Any] = []
    names: dict[str, str] = {}

    def send(name: str, *args: Any) -> Any:
        result = cluster.app.send_task(name, args=args)
        names[result.id] = name
        return result

    # coalesce: a run under way when ten more of its key arrive: exactly one more run
    for key in ("c1", "c2", "c3"):
        first = send(COALESCED, key, "first", 0.3)
        wait_for(lambda k=key: any(e["key"] == k for e in starts(journal, COALESCED)),
                 timeout=60, interval=0.02, what=f"the first run of {key}")  # fmt: skip
        later = [send(COALESCED, key, i, 0.1) for i in range(10)]
        results += [first, *later]
    results += [send(COALESCED, "c4", i) for i in range(20)]  # queued at once

    # debounce: nine keys, a burst of five each
    for i in range(5):
        results += [send(DEBOUNCED, f"d{k}", i) for k in range(9)]
        time.sleep(0.05)

    # a limit, a cap of two per key, batches of up to eight
    results += [send(LIMITED, "l", i) for i in range(40)]
    results += [send(CAPPED, f"k{i % 3}", i) for i in range(30)]
    results += [send(BATCHED, "b", i) for i in range(40)]

    def pending() -> Counter[str]:
        return Counter(names[r.id] for r in results if not r.ready())

    wait_for(lambda: not pending(), timeout=120, interval=0.5,
             what=lambda: f"every result; pending per task: {pending()}")  # fmt: skip
    for result in results:
        result.get(timeout=10)
    time.sleep(1.0)  # a late second body shows up in this period

    bodies = Counter((e["task"], e["id"]) for e in starts(journal))
    twice = Counter(task for (task, _), n in bodies.items() if n > 1)
    assert not twice, f"ids whose body ran more than once on {pool}, per task: {twice}"

    runs = Counter(e["key"] for e in starts(journal, COALESCED))
    assert [runs[k] for k in ("c1", "c2", "c3")] == [2, 2, 2], runs
    assert runs["c4"] >= 1
    ran = Counter(e["task"] for e in starts(journal))
    assert (ran[LIMITED], ran[CAPPED], ran[BATCHED]) == (40, 30, 40), ran
    assert 9 <= ran[DEBOUNCED] <= 45, ran
    assert not problems(worker.log()), "\n".join(problems(worker.log())[:20])
