"""Restart the broker in the middle of limited, retried and revoked work.

Redis: a persistent Redis of the test's own is the broker and the store, stopped
and started again (the shared one keeps nothing on disk). RabbitMQ: the shared
broker's application is stopped and started (durable queues, persistent
messages). Either way the workers reconnect, nothing is lost, the global limit
still holds, and a revoke sent after the restart is honoured.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster
from tests.support.brokers import restartable_broker
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_reliability",)


@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_broker_restart_mid_run(kind: str, ns: str, tmp_path: Path, journal: Journal) -> None:
    with restartable_broker(kind, tmp_path) as (url, restart):
        cluster = Cluster(url, ns, tmp_path)
        try:
            run_through_a_restart(cluster, journal, restart)
        finally:
            cluster.stop()


def run_through_a_restart(cluster: Cluster, journal: Journal, restart: Callable[[], None]) -> None:
    cluster.configure(
        include=INCLUDE,
        task_acks_late=True,
        extras_sync_interval=1.0,
        broker_transport_options={"visibility_timeout": 5, "unacked_restore_interval": 1},
    )
    app = cluster.app
    worker = cluster.worker("w1")
    limited = [app.send_task("tests.reliability.limited", args=(i,)).id for i in range(40)]
    retried = [app.send_task("tests.reliability.retried", args=(i,)).id for i in range(10)]
    delayed = [app.send_task("tests.noop", args=(f"late{i}",), countdown=12).id
               for i in range(5)]  # fmt: skip

    wait_for(lambda: len(journal) >= 10, timeout=60, what="the run to be under way")
    restart()
    wait_for(lambda: worker.log().count("Connected to") >= 2, timeout=90,
             what="the worker to reconnect")  # fmt: skip
    app.control.revoke(delayed)  # after the restart: store and broadcast must both work again

    done = wait_for(
        lambda: (d := Counter(e["id"] for e in journal.entries() if e.get("outcome") == "done"))
        .keys() >= {*limited, *retried} and d,
        timeout=120, interval=0.5, what="every limited and retried task after the restart",
    )  # fmt: skip
    wait_for(lambda: time.time() > journal.entries()[0]["t"] + 16, timeout=30, interval=0.5,
             what="the revoked tasks' ETA to pass")  # fmt: skip
    ran = {e["id"] for e in journal.entries()}
    assert not ran & set(delayed), "a task revoked after the restart ran"

    starts = sorted(e["t"] for e in journal.entries() if e["task"] == "tests.reliability.limited")
    busiest = max(sum(1 for s in starts if t <= s < t + 1.0) for t in starts)
    duplicates = sum(n - 1 for n in done.values())
    print(f"\n{cluster.broker.split(':')[0]}: 50 tasks done through a restart, "
          f"{duplicates} ran twice, busiest second of the 10/s limit: {busiest}")  # fmt: skip
    assert busiest <= 10 + 2  # rate + burst, before and after the restart
    assert worker.alive()
