"""A clean stop logs no warning (DESIGN.md, "Never freezes"): a prefork worker with every
capability in use (limits, concurrency slots, coalescing, retry policies, the ETA store,
stats, revoke sync), with tasks waiting for a limit, a slot, a coalescing key's run and
their ETA, stopped with SIGTERM (warm shutdown), exits on its own and logs no WARNING,
ERROR or CRITICAL line from the signal on."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from amqp.exceptions import ChannelError

# imported here too: the producer stamps the send time on coalesced tasks' messages
import tests.support.tasks_coalesce  # noqa: F401
from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = (
    "tests.support.tasks_delay",
    "tests.support.tasks_concurrency",
    "tests.support.tasks_coalesce",
    "tests.support.tasks_policies",
)
#: A Celery log line at warning level or above: ``[2026-01-01 00:00:00,000: WARNING/...]``.
ALARM = re.compile(r": (WARNING|ERROR|CRITICAL)/")


def count(journal: Journal, task: str, **fields: Any) -> int:
    return sum(1 for e in journal.entries()
               if e["task"] == task and all(e.get(k) == v for k, v in fields.items()))  # fmt: skip


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_warm_shutdown_with_every_capability_in_use_logs_no_warning(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE, extras_eta_store=True, extras_eta_threshold=1.0)
    worker = cluster.worker("w1", concurrency=2, pool="prefork")
    now = time.time()
    for i in range(5):  # the ETA store: due in 2 s (run) and in 10 min (parked at the stop)
        send("tests.delay.eta_task", f"soon{i}", now + 2, eta=datetime.fromtimestamp(now + 2, UTC))
        send("tests.delay.eta_task", f"later{i}", now + 600,
             eta=datetime.fromtimestamp(now + 600, UTC))  # fmt: skip
    coalesced = [send("tests.coalesce.per_key", "k", f"c{i}") for i in range(5)]  # coalesce
    for i in range(6):
        send("tests.concurrency.global2", i)  # concurrency(2)
    for i in range(10):
        send("tests.delay.limited10", i)  # limit("10/s"), global
    for i in range(4):
        send("tests.policies.tunable", i)  # limit("1/s"), worker scope: waiting at the stop
    send("tests.policies.flaky", "item", 2, "retried")  # retry_policy: two retries, then ok
    cluster.app.control.revoke("never-sent-id")  # revoke sync: stored and synced

    wait_for(lambda: count(journal, "tests.delay.eta_task") >= 5, timeout=60, what="ETA runs")
    wait_for(lambda: count(journal, "tests.concurrency.global2", phase="end") >= 6, timeout=60,
             what="concurrency runs")  # fmt: skip
    wait_for(lambda: count(journal, "tests.delay.limited10") >= 10, timeout=60,
             what="limited runs")  # fmt: skip
    wait_for(lambda: count(journal, "tests.policies.flaky") >= 3, timeout=60, what="retries")
    assert all(r.get(timeout=60)["key"] == "k" for r in coalesced)
    assert cluster.stats(worker.hostname).get("extras"), "stats answered"
    time.sleep(2.5)  # a sync round (extras_sync_interval 2 s) runs before the stop
    # at the stop: runs waiting for a concurrency slot and for a coalescing key's run
    for i in range(6, 12):
        send("tests.concurrency.global2", i, 1.0)
    send("tests.coalesce.per_key", "k", "long", 2.0, True)
    wait_for(lambda: count(journal, "tests.coalesce.per_key", phase="start", tag="long"),
             timeout=30, what="the long coalesced run")  # fmt: skip
    send("tests.coalesce.per_key", "k", "waiting")
    send("tests.coalesce.per_key", "k", "covered")

    before = len(worker.log())
    assert worker.proc is not None
    os.kill(worker.pid, signal.SIGTERM)  # to the main process, as a service manager does
    try:
        worker.proc.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit 30 s after SIGTERM:\n{worker.log()[before:][-3000:]}")
    stop_log = worker.log()[before:]
    assert "Warm shutdown" in stop_log, stop_log[-3000:]
    alarms = [line for line in stop_log.splitlines() if ALARM.search(line)]
    assert not alarms, "a clean stop logged:\n" + "\n".join(alarms)
    assert worker.proc.returncode == 0, (worker.proc.returncode, stop_log[-3000:])


def queued(cluster: Cluster) -> int:
    """Messages ready in the test's queue (a stopped worker's unacked ones are back in it)."""
    with cluster.app.connection_for_write() as connection:
        queue = cluster.app.amqp.queues[cluster.ns](connection.default_channel)
        try:
            return int(queue.queue_declare(passive=True).message_count)
        except ChannelError:  # Redis: an empty queue is no key at all
            if connection.transport.driver_type != "redis":
                raise
            return 0


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"], indirect=True)
def test_a_task_sent_to_a_pool_process_at_the_stop_runs_once_and_the_stop_waits_for_it_alone(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """A job written whole to a pool process that has not yet said it took it (here the
    process is paused; in a worker that receives tasks all the time, the event loop's last
    turn) when the stop begins: Celery 5.6 and 5.7 drop it from the pool's books, the
    process runs it anyway, and then waits 30 s at exit for its result to be counted, the
    stop with it, and the message, never acked, is back in the queue to run again. With
    celery-extras the stop waits for that task only, and its message is acked."""
    cluster.configure(include=("tests.support.tasks",))
    worker = cluster.worker("w1", concurrency=1, pool="prefork")
    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=10).stats()
    (child,) = stats[worker.hostname]["pool"]["processes"]
    os.kill(child, signal.SIGSTOP)
    try:
        result = send("tests.sleep", 0.1, "in flight")
        wait_for(lambda: "received" in worker.log(), timeout=30, what="the task received")
        os.kill(worker.pid, signal.SIGTERM)
        wait_for(lambda: "keeps 1 job(s)" in worker.log(), timeout=30,
                 what="the pool keeping the job written to its process")  # fmt: skip
    finally:
        os.kill(child, signal.SIGCONT)
    assert worker.proc is not None
    started = time.monotonic()
    try:
        worker.proc.wait(20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit 20 s after the stop:\n{worker.log()[-3000:]}")
    assert time.monotonic() - started < 15, "the stop waited for a result it had dropped"
    assert worker.proc.returncode == 0, worker.log()[-3000:]
    assert result.get(timeout=10) == "in flight"
    assert [e["tag"] for e in journal.entries()] == ["in flight"]
    assert queued(cluster) == 0, "the message of the task that ran is back in the queue"
