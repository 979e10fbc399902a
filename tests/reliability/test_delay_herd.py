"""Herds: thousands of ETA tasks due at the same instant, parked in the delay store and
released by the movers of two workers, while the test SIGKILLs the worker whose mover is
releasing, again and again. Every task runs, once."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.integration.conftest import MUTEX_EXPIRE, Cluster, restartable_cluster
from tests.support.brokers import Restartable
from tests.support.journal import Journal
from tests.support.workers import wait_for

from .test_delay_faults import Kill, done_ids, ran_once_but_for_kills, sigkill

INCLUDE = ("tests.support.tasks_reliability",)
HERD = "tests.reliability.herd"  # acks_late, journals "done"


def send_herd(cluster: Cluster, n: int, due_in: float) -> tuple[list[str], float]:
    """*n* herd tasks, all with the ETA *due_in* s from now: ``(ids, the ETA as epoch s)``."""
    due = datetime.now(UTC) + timedelta(seconds=due_in)
    with cluster.app.producer_or_acquire() as producer:
        ids = [cluster.app.send_task(HERD, (i,), eta=due, producer=producer).id
               for i in range(n)]  # fmt: skip
    assert datetime.now(UTC) < due, f"sending {n} tasks took longer than {due_in} s"
    return ids, due.timestamp()


def parked(cluster: Cluster) -> int:
    info = cluster.app.control.inspect(timeout=5).stats() or {}
    return max((w.get("extras_delay", {}).get("depth") or 0 for w in info.values()), default=0)


#: CI's herd on two workers; ``python -m bench herd`` runs one of 20,000 (its figures:
#: docs/benchmarks.md), ``--two-workers N`` any size
HERD_SIZE = 5_000


@pytest.mark.exclusive
@pytest.mark.scenario
@pytest.mark.timeout(600)
@pytest.mark.parametrize("broker", ["redis"], indirect=True)  # the broker does not matter here
def test_a_herd_due_at_once_runs_each_task_once_on_two_workers(
    cluster: Cluster, journal: Journal
) -> None:
    cluster.configure(include=INCLUDE, extras_eta_store=True, extras_eta_threshold=5.0)
    cluster.worker("w1")
    cluster.worker("w2")
    # sending 20,000 took 66.7 s in CI (2026-11-27), the two workers parking them as they
    # came, on a slow VM: 5,000 (~17 s there) get 30 s
    ids, due = send_herd(cluster, HERD_SIZE, 30.0)
    wait_for(lambda: len(journal) >= HERD_SIZE, timeout=30 + 300, interval=1.0,
             what=f"the herd of {HERD_SIZE:,} to run")  # fmt: skip
    time.sleep(2.0)  # a measurement period: a late second run shows up in it
    entries = [e for e in journal.entries() if e.get("outcome") == "done"]
    runs = Counter(e["id"] for e in entries)
    early = [e for e in entries if e["t"] < due - 0.05]
    print(f"\nherd of {HERD_SIZE:,}: {len(runs)} ran, {sum(n - 1 for n in runs.values())} "
          f"twice, last start {max(e['t'] for e in entries) - due:.1f} s after the ETA, "
          f"on {len({e['worker'] for e in entries})} workers")  # fmt: skip
    assert set(runs) == set(ids)
    assert all(n == 1 for n in runs.values())
    assert early == [], f"{len(early)} ran before their ETA"
    assert {e["worker"] for e in entries} == {w.hostname for w in cluster.workers}


@pytest.mark.exclusive
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_sigkill_of_the_releasing_worker_again_and_again_loses_no_task_of_a_herd(
    kind: str, ns: str, tmp_path: Path, journal: Journal
) -> None:
    with restartable_cluster(kind, ns, tmp_path) as (cluster, broker):
        kill_while_releasing(cluster, journal, broker)


def kill_while_releasing(cluster: Cluster, journal: Journal, broker: Restartable) -> None:
    """A herd of 3,000 parked, due at once; each time a share of it ran, the worker that
    released last (its mover mid-batch) is killed and another started."""
    cluster.configure(
        include=INCLUDE,
        extras_eta_store=True,
        extras_eta_threshold=2.0,
        extras_delay_lease=2.0,  # a killed mover's claims come back after 2 s
        extras_delay_batch=50,
        extras_delay_lookahead=2.5,  # the herd stays parked until 2.5 s before it is due
        # a killed worker's unacked messages come back 30 s after their delivery. A herd's
        # last tasks wait unacked in their worker for the early publish and for the herd
        # ahead of them: 5 s delivered dozens again while their first run waited or ran in
        # a live worker, two such tests at once (kombu's visibility timeout; plain Celery
        # alike), which is not what this test is about
        broker_transport_options={
            "visibility_timeout": 30,
            "unacked_restore_interval": 1,
            "unacked_mutex_expire": MUTEX_EXPIRE,
        },
    )
    workers = {name: cluster.worker(name) for name in ("w1", "w2")}
    ids, _due = send_herd(cluster, 3000, 20.0)
    wait_for(lambda: parked(cluster) >= 2500, timeout=60, interval=0.5,
             what="the herd to be parked")  # fmt: skip
    kills: list[Kill] = []
    for round_, share in enumerate((300, 1000, 1700)):
        wait_for(lambda n=share: len(done_ids(journal)) >= n, timeout=120, interval=0.1,
                 what=f"{share} tasks done")  # fmt: skip
        # the live worker that ran the latest of the last entries (a worker killed a moment
        # ago may still have the latest of them)
        live = {w.hostname: n for n, w in workers.items()}
        recent = [e for e in journal.entries()[-200:] if e["worker"] in live]
        name = live[max(recent, key=lambda e: e["t"])["worker"]] if recent else next(iter(workers))
        # its claims, published and not, its timer and its running tasks die
        kills.append(sigkill(workers.pop(name)))
        workers[f"k{round_}"] = cluster.worker(f"k{round_}")

    ran_once_but_for_kills(cluster, journal, broker, ids, kills, timeout=240)
