"""A warm stop of a ``gevent`` worker during batches (chaos seed 792644): a batch that ran
is acked, once; a call received after the stop began (Celery's loop takes messages for one
more turn) does not start its batch, and goes back to the broker unacked."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import redis

from tests.integration.conftest import Cluster, restartable_cluster
from tests.support.journal import Journal
from tests.support.tasks_warm_stop import HELD
from tests.support.workers import WorkerProcess, wait_for

INCLUDE = ("tests.support.tasks_warm_stop",)
TASK = "tests.warm_stop.batched"
#: Nothing but the task queue on the worker's connection: the last turn of its loop ends
#: with the test's message or its 2 s drain, not with another worker's heartbeat.
QUIET = ("--without-gossip", "--without-mingle", "--without-heartbeat")


def starts(journal: Journal) -> Counter[str]:
    """How many times each call's body started, by call id."""
    return Counter(e["id"] for e in journal.entries() if e.get("phase") == "start")


def test_a_warm_stop_acks_the_batch_that_ran_and_gives_back_the_one_not_run_seed_792644(
    ns: str, tmp_path: Path, journal: Journal
) -> None:
    with restartable_cluster("redis", ns, tmp_path) as (cluster, broker):
        cluster.configure(include=INCLUDE, task_acks_late=True)
        w1 = cluster.worker("w1", pool="gevent", concurrency=4, args=QUIET)
        ran = [cluster.app.send_task(TASK, ("a", HELD)).id for _ in range(3)]
        wait_for(lambda: set(ran) <= starts(journal).keys(), timeout=30,
                 what="the first batch to run")  # fmt: skip
        waiting = [cluster.app.send_task(TASK, ("b", i)).id for i in range(2)]
        wait_for(lambda: all(f"{TASK}[{i}] received" in w1.log() for i in waiting),
                 timeout=30, what="two calls of the next batch to wait in it")  # fmt: skip
        last = warm_stop_then_send(cluster, w1)
        wait_for(
            lambda: f"{TASK}[{last}] received" in w1.log(),
            timeout=30,
            what="the stopping worker to receive the call that fills the next batch",
        )
        journal.raise_flag("go")  # the first batch returns, during the stop
        assert w1.proc is not None and w1.proc.wait(60) == 0
        assert starts(journal) == Counter(ran)  # the full second batch did not start

        cluster.worker("w2", pool="gevent", concurrency=4, args=QUIET)
        settle(cluster, broker.url, ran + waiting + [last])
        assert starts(journal) == Counter(ran + waiting + [last])  # each call ran once
        runs = {e["id"]: e["worker"] for e in journal.entries() if e.get("phase") == "start"}
        assert {runs[i].split("@")[0] for i in ran} == {"w1"}
        assert {runs[i].split("@")[0] for i in [*waiting, last]} == {"w2"}


def warm_stop_then_send(cluster: Cluster, worker: WorkerProcess) -> str:
    """SIGTERM *worker* (a warm stop), then send the call that fills its open batch, so that
    the worker reads it after the signal: stopped meanwhile, the worker handles the signal
    as it wakes, before the reply its waiting ``BRPOP`` got. The call's id."""
    worker.pause()
    try:
        os.kill(worker.pid, signal.SIGTERM)
        last: str = cluster.app.send_task(TASK, ("b", 2)).id
    finally:
        worker.resume()
    wait_for(lambda: "Warm shutdown" in worker.log(), timeout=30, what="the warm stop")
    return last


def settle(cluster: Cluster, broker_url: str, ids: list[str]) -> None:
    """Wait until every call of *ids* succeeded and the broker holds none of its messages,
    queued or unacked (a call whose ack was lost would be back, and run, by then)."""
    client = redis.Redis.from_url(broker_url)

    def settled() -> bool:
        done = all(cluster.app.AsyncResult(i).state == "SUCCESS" for i in ids)
        return done and not client.llen(cluster.ns) and not client.hlen(f"{cluster.ns}.unacked")

    try:
        wait_for(settled, timeout=60, interval=0.2, what="every call to succeed, none left")
    finally:
        client.close()
