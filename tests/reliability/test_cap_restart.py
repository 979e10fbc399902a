"""A cluster-wide cap holds while its holders run through a broker restart (issue 56's
checker, seeds 665725 and 104379: a ``concurrency(2)`` ran 3 at once after a broker
restart on ``gevent``).

Celery 5.5 and 5.6 empty their reserved set as the connection is lost (``Consumer.on_close``,
celery#10345, fixed in 5.7), running requests with it. The admission pipeline's tick took
that for requests Celery forgot ("ended unseen") and freed their slots while their bodies
ran on: the next message of the task, redelivered after the restart, took one and ran as a
third. The bodies here run until the test says so, so the cap is full while the broker
restarts and long after.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import Cluster, restartable_cluster
from tests.support.brokers import REDIS_URL
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_cap_restart",)
TASK = "tests.cap_restart.held"


def _starts(journal: Journal) -> list[dict[str, object]]:
    return [e for e in journal.entries() if e.get("phase") == "start"]


def _tags(journal: Journal, phase: str) -> set[object]:
    return {e["tag"] for e in journal.entries() if e.get("phase") == phase}


def _waiting(cluster: Cluster, hostname: str) -> int:
    """How many requests of the task wait in the worker's concurrency gate."""
    gates = cluster.stats(hostname).get("extras_policies", {})
    task = gates.get("concurrency", {}).get("tasks", {}).get(TASK, {})
    return int(task.get("waiting", 0))


def test_a_cap_holds_while_its_holders_run_through_a_broker_restart_seed_665725(
    ns: str, tmp_path: Path, journal: Journal
) -> None:
    with restartable_cluster("redis", ns, tmp_path) as (cluster, broker):
        cluster.configure(
            include=INCLUDE,
            task_acks_late=True,
            extras_redis_url=REDIS_URL,  # the store stays up: the broker alone restarts
            broker_transport_options={"visibility_timeout": 5, "unacked_restore_interval": 1},
        )
        worker = cluster.worker("w1", pool="gevent", concurrency=4)
        for tag in range(4):
            cluster.app.send_task(TASK, args=(tag,))
        wait_for(lambda: len(_starts(journal)) >= 2, timeout=60, what="two bodies to start")
        broker.restart()
        wait_for(lambda: worker.log().count("Connected to") >= 2, timeout=90,
                 what="the worker to reconnect")  # fmt: skip
        # the messages the cap kept waiting, and the copies of the two running (their
        # deliveries past the visibility timeout), come back and wait; before the fix the
        # running ones' slots were freed as the connection went, and a third body ran
        wait_for(lambda: len(_starts(journal)) > 2 or _waiting(cluster, worker.hostname) >= 4,
                 timeout=90, interval=0.5, what="the waiting messages to come back")  # fmt: skip
        running = [(e["id"], e["tag"]) for e in _starts(journal)]
        journal.raise_flag("go")
        assert len(running) == 2, f"{running} ran at once for concurrency(2)"
        assert "ended unseen" not in worker.log()
        wait_for(lambda: _tags(journal, "end") == {0, 1, 2, 3}, timeout=120, interval=0.5,
                 what="every message to end")  # fmt: skip
