"""A request a gate kept waiting, resumed as a task ends on a full green pool (Redis).

On ``-P gevent`` / ``-P eventlet`` a task's end is heard in the ending task's own greenlet.
A slot it frees lets the next waiting request on through the admission pipeline; handed to
the pool from that greenlet, the request would wait in the pool's ``spawn`` for a free slot:
the ending greenlet's own, freed only once it returns. On a full pool gevent's worker froze
for good; eventlet's ``spawn`` runs the request in place instead, inside the ending one
(which acks only after it), and the next inside that, one stack deeper each time. The
pipeline hands a resumed request to a green pool from a greenlet of the worker's timer.

Checked on full pools: ``concurrency(1)`` on ``-c 1``, ``concurrency(2)`` on ``-c 2``,
``extras_queue_concurrency`` of 1 on ``-c 1``, and a coalesced key whose message waits
for the run before it to end; threads and prefork as controls. Every run must end, each
once, within :data:`DEADLINE`, and every run's stack as deep as every other's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_green_resume",)
ONE = "tests.green.one"  # concurrency(1)
TWO = "tests.green.two"  # concurrency(2)
PLAIN = "tests.green.plain"  # no policy
COALESCED = "tests.green.coalesced"  # coalesce(): one key
#: s every run has to end in (a frozen worker never ends them)
DEADLINE = 30.0
POOLS = ["gevent", "eventlet", "threads", "prefork"]

pytestmark = [pytest.mark.parametrize("broker", ["redis"], indirect=True),
              pytest.mark.parametrize("pool", POOLS)]  # fmt: skip


def ends(journal: Journal) -> list[dict[str, Any]]:
    return [e for e in journal.entries() if e["phase"] == "end"]


def wait_ended(journal: Journal, count: int) -> list[dict[str, Any]]:
    """The *count* runs' end entries, once all are in (each run once: no more come)."""
    wait_for(lambda: len(ends(journal)) >= count, timeout=DEADLINE, interval=0.2,
             what=lambda: f"{count} runs, {len(ends(journal))} ended")  # fmt: skip
    return ends(journal)


def depths(entries: list[dict[str, Any]]) -> set[int]:
    """The stack depths the runs ended at: one, unless a run started inside another."""
    return {e["depth"] for e in entries}


def test_concurrency_1_on_a_pool_of_1(cluster: Cluster, journal: Journal, pool: str) -> None:
    cluster.configure(include=INCLUDE)
    cluster.worker(f"r1{pool}", concurrency=1, pool=pool)
    for i in range(5):
        cluster.app.send_task(ONE, args=(i,))
    runs = wait_ended(journal, 5)
    assert Counter(e["tag"] for e in runs) == Counter(range(5))
    assert len(depths(runs)) == 1, depths(runs)


def test_concurrency_2_on_a_pool_of_2(cluster: Cluster, journal: Journal, pool: str) -> None:
    cluster.configure(include=INCLUDE)
    cluster.worker(f"r2{pool}", concurrency=2, pool=pool)
    for i in range(12):
        cluster.app.send_task(TWO, args=(i, 0.05))
    runs = wait_ended(journal, 12)
    assert Counter(e["tag"] for e in runs) == Counter(range(12))
    assert len(depths(runs)) == 1, depths(runs)


def test_a_queue_cap_of_1_on_a_pool_of_1(cluster: Cluster, journal: Journal, pool: str) -> None:
    slow = f"{cluster.ns}.slow"
    cluster.configure(include=INCLUDE, extras_queue_concurrency={slow: 1})
    cluster.worker(f"rq{pool}", concurrency=1, pool=pool, queues=[slow])
    for i in range(5):
        cluster.app.send_task(PLAIN, args=(i,), queue=slow)
    runs = wait_ended(journal, 5)
    assert Counter(e["tag"] for e in runs) == Counter(range(5))
    assert len(depths(runs)) == 1, depths(runs)


def test_a_coalesced_message_waiting_for_the_run_before_it(
    cluster: Cluster, journal: Journal, send: Callable[..., Any], pool: str
) -> None:
    """A message of the key whose run has started waits for that run's end, then runs."""
    cluster.configure(include=INCLUDE)
    cluster.worker(f"rc{pool}", concurrency=1, pool=pool)
    first = send(COALESCED, 0, 1.0, True)
    wait_for(lambda: len(journal) >= 1, timeout=DEADLINE, interval=0.05,
             what="the first run's start")  # fmt: skip
    second = send(COALESCED, 1, 0.05)
    assert [first.get(timeout=DEADLINE), second.get(timeout=DEADLINE)] == [0, 1]
    runs = ends(journal)
    assert sorted(e["tag"] for e in runs) == [0, 1]
    assert len(depths(runs)) == 1, depths(runs)


def test_a_warm_stop_loses_nothing_and_runs_nothing_twice(
    cluster: Cluster, journal: Journal, pool: str
) -> None:
    """Stopped warmly as runs end and resume the next: what did not start goes back to the
    broker, unacked, and the next worker runs it; each body runs once."""
    cluster.configure(include=INCLUDE)
    first = cluster.worker(f"rs{pool}", concurrency=1, pool=pool)
    for i in range(6):
        cluster.app.send_task(ONE, args=(i, 0.3))
    wait_for(lambda: ends(journal), timeout=DEADLINE, interval=0.05, what="a first run")
    assert first.stop(timeout=DEADLINE) == 0
    cluster.worker(f"rt{pool}", concurrency=1, pool=pool)
    assert Counter(e["tag"] for e in wait_ended(journal, 6)) == Counter(range(6))
