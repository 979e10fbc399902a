"""A broker restart leaves the worker's prefetch window whole (chaos seed 578629).

After a reconnect Celery lowers the window by the tasks still running, then raises it after
each ack to ``min(maximum, window + multiplier)``; the tasks celery-extras holds (here the
calls of a batch) widen the window by one each, and that cap dropped their widenings: the
narrowings as they ended took the window below its size for good (a ``threads`` worker of
seed 578629 ended a replay with 3 of its 16)."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import restartable_cluster
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_prefetch",)
#: ``-c 4`` and Celery's default multiplier (4): the window's size
WINDOW = 16


def test_a_broker_restart_leaves_the_prefetch_window_whole_seed_578629(
    ns: str, tmp_path: Path, journal: Journal
) -> None:
    with restartable_cluster("rabbitmq", ns, tmp_path) as (cluster, broker):
        cluster.configure(include=INCLUDE, task_acks_late=True)
        app = cluster.app
        worker = cluster.worker("w1", pool="threads", concurrency=4)
        first = app.send_task("tests.prefetch.hold", ("first",))  # running through the restart
        wait_for(lambda: _started(journal, "first") == 1, timeout=30, what="a running task")
        broker.restart()
        wait_for(lambda: worker.log().count("Connected to") >= 2, timeout=90,
                 what="the worker to reconnect")  # fmt: skip
        second = app.send_task("tests.prefetch.hold", ("second",))  # received after it
        wait_for(lambda: _started(journal, "second") == 1, timeout=30, what="a task after it")
        calls = [app.send_task("tests.prefetch.batched", (i,)) for i in range(10)]
        wait_for(lambda: all(f"[{c.id}] received" in worker.log() for c in calls), timeout=30,
                 what="the batch's calls held in the worker")  # fmt: skip
        journal.raise_flag("second")  # its ack raises the window, held calls in it
        journal.raise_flag("first")
        for result in [first, second, *calls]:
            result.get(timeout=60)
        seen: list[object] = []

        def whole() -> bool:
            seen.append(cluster.stats(worker.hostname).get("prefetch_count"))
            return seen[-1] == WINDOW

        wait_for(whole, timeout=30, interval=0.5,
                 what=lambda: f"the window back to {WINDOW}, not {seen[-1:]}")  # fmt: skip


def _started(journal: Journal, flag: str) -> int:
    return sum(1 for e in journal.entries() if e.get("flag") == flag and e["phase"] == "start")
