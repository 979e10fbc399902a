"""``celery purge`` drops what the delay store holds for the queues it purges (issue 34):
real ``celery worker`` processes park ETA tasks (``extras_eta_store``), ``celery -A ...
purge`` runs as a process of its own, its output counts the parked tasks, and none of
them runs after its ETA. ``-Q`` purges one queue's parked tasks and leaves another's;
entries on their way (claimed, released to a due queue) are dropped too; ``celery extras
delayed --drop`` and ``app.control.purge()`` drop them as well.

On Redis and on RabbitMQ (the store then is the result backend's Redis); the first test also
with the store on the 3-master Redis Cluster (12 shards).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from celery_extras import delayed
from celery_extras.delay.entry import Entry
from celery_extras.delay.mover_thread import publish_entry
from celery_extras.delay.parking import Parker
from tests.integration.conftest import Cluster
from tests.support import proj
from tests.support.journal import Journal
from tests.support.workers import ROOT, wait_for

INCLUDE = ("tests.support.tasks_delay",)
ETA_TASK = "tests.delay.eta_task"  # journals its tag
LIMITED = "tests.delay.limited10"
#: Seconds ahead the ETA tasks are sent: parked at once (threshold 2 s), and purged well
#: before a mover claims them (1 s before they are due), even on a loaded machine.
AHEAD = 20.0


def eta_store(cluster: Cluster) -> None:
    cluster.configure(include=INCLUDE, extras_eta_store=True, extras_eta_threshold=2.0)


def celery(cluster: Cluster, *args: str, answer: str = "") -> subprocess.CompletedProcess[str]:
    """``celery -A tests.support.proj ARGS`` as a process of its own, on the test's app."""
    env = {**os.environ, **proj.worker_env(cluster.broker, cluster.ns, cluster.conf,
                                           cluster.include)}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.support.proj", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, input=answer,
    )  # fmt: skip


def send_eta(cluster: Cluster, task: str, tags: list[str], due: float, **options: Any) -> None:
    for tag in tags:
        cluster.app.send_task(task, args=(tag,), kwargs={"due": due} if task == ETA_TASK else {},
                              eta=datetime.fromtimestamp(due, UTC), **options)  # fmt: skip


def parked(cluster: Cluster) -> dict[str, int]:
    """Parked tasks per task name, as ``celery extras delayed`` lists them."""
    return {name: t["parked"] for name, t in delayed(cluster.app)["tasks"].items()}


def wait_parked(cluster: Cluster, expected: dict[str, int]) -> None:
    wait_for(lambda: parked(cluster) == expected, timeout=60, interval=0.3,
             what=f"parked {expected}")  # fmt: skip


def ran_alone(journal: Journal, cluster: Cluster, canary: str, after: float) -> list[str]:
    """Send *canary*, an ETA task due *after* (later than the ETA of the tasks that must not
    run), wait for its run and a little more; the tags that ran, in order."""
    send_eta(cluster, ETA_TASK, [canary], after)
    wait_for(lambda: canary in {e["tag"] for e in journal.entries()},
             timeout=after - time.time() + 90, interval=0.3, what=canary)  # fmt: skip
    time.sleep(2.0)
    return [e["tag"] for e in journal.entries()]


def gate_stats(cluster: Cluster, hostname: str) -> dict[str, Any]:
    stats = cluster.app.control.inspect(destination=[hostname], timeout=10).stats() or {}
    gate: dict[str, Any] = (stats.get(hostname) or {}).get("extras_delay_gate", {})
    return gate


def test_celery_purge_drops_the_parked_eta_tasks_and_counts_them(
    cluster: Cluster, journal: Journal
) -> None:
    eta_store(cluster)
    cluster.worker("w1", concurrency=1)
    due = time.time() + AHEAD
    send_eta(cluster, ETA_TASK, [f"p{i}" for i in range(5)], due)
    wait_parked(cluster, {ETA_TASK: 5})

    done = celery(cluster, "purge", "-f")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "No messages purged from 1 queue.",  # Celery's line: the ETA messages were acked
        "Purged 5 parked tasks from the delay store.",
    ], done.stdout
    assert time.time() < due - 1.0, "purged too late to tell: raise AHEAD"
    assert parked(cluster) == {} and delayed(cluster.app)["depth"] == 0
    assert ran_alone(journal, cluster, "canary", due + 3.0) == ["canary"]


@pytest.mark.parametrize("broker", ["redis"], indirect=True)  # the store's path
def test_purge_of_one_queue_keeps_the_parked_tasks_of_another(
    cluster: Cluster, journal: Journal
) -> None:
    eta_store(cluster)
    other = f"{cluster.ns}.b"
    cluster.worker("w1", concurrency=1, queues=(cluster.ns, other))
    due = time.time() + AHEAD
    send_eta(cluster, ETA_TASK, [f"a{i}" for i in range(5)], due)
    send_eta(cluster, ETA_TASK, [f"b{i}" for i in range(5)], due, queue=other)
    wait_parked(cluster, {ETA_TASK: 10})

    excluded = celery(cluster, "purge", "-f", "-X", cluster.ns)  # every known queue, less one
    assert excluded.returncode == 0 and excluded.stdout == "", excluded.stdout + excluded.stderr
    assert parked(cluster) == {ETA_TASK: 10}
    done = celery(cluster, "purge", "-f", "-Q", other)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "No messages purged from 1 queue.",
        "Purged 5 parked tasks from the delay store.",
    ], done.stdout
    assert time.time() < due - 1.0, "purged too late to tell: raise AHEAD"
    assert parked(cluster) == {ETA_TASK: 5}
    wait_for(lambda: len(journal) >= 5, timeout=AHEAD + 90, interval=0.3, what="a0..a4")
    time.sleep(3.0)
    assert Counter(e["tag"] for e in journal.entries()) == Counter(f"a{i}" for i in range(5))


@pytest.mark.parametrize("broker", ["redis"], indirect=True)  # the store's path
def test_purge_drops_entries_on_their_way_and_empties_their_due_queue(
    cluster: Cluster, journal: Journal
) -> None:
    """The worker's mover is stopped; the test plays one: of 5 parked entries it claims 3,
    publishes 2 to the due queue and releases them. The purge drops all 5 (2 parked, 3 on
    their way) and empties the due queue; the third claimed entry, published after the
    purge (a late mover), is dropped by the worker that receives it."""
    eta_store(cluster)
    parker = cluster.worker("w1", concurrency=1)
    due = time.time() + AHEAD
    send_eta(cluster, ETA_TASK, [f"w{i}" for i in range(5)], due)
    wait_parked(cluster, {ETA_TASK: 5})
    parker.kill()  # its mover must not release what the test claims
    store = Parker(cluster.app, background=True).store
    claims = store.claim(3600.0, 600.0, ["mine-1", "mine-2", "mine-3"]).items
    assert len(claims) == 3
    for claim in claims[:2]:
        publish_entry(cluster.app, Entry.loads(claim.raw), claim)
    assert store.release_all([(c.entry_id, c.token) for c in claims[:2]], 600.0) == 2

    done = celery(cluster, "purge", "-f")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "Purged 5 parked tasks from the delay store."
    late = claims[2]
    publish_entry(cluster.app, Entry.loads(late.raw), late)  # the mover, after the purge
    assert store.release(late.entry_id, late.token, 600.0) is False
    worker = cluster.worker("w2", concurrency=1)
    assert ran_alone(journal, cluster, "canary", due + 3.0) == ["canary"]
    gate = gate_stats(cluster, worker.hostname)
    assert gate["purged"] == 1 and gate["taken"] == 1, gate  # the late copy; the canary


@pytest.mark.parametrize("broker", ["redis"], indirect=True)  # the store's path
def test_delayed_drop_and_app_control_purge_drop_parked_tasks(
    cluster: Cluster, journal: Journal
) -> None:
    eta_store(cluster)
    cluster.worker("w1", concurrency=1)
    due = time.time() + AHEAD
    send_eta(cluster, ETA_TASK, [f"e{i}" for i in range(3)], due)
    send_eta(cluster, LIMITED, ["l0", "l1"], due)
    wait_parked(cluster, {ETA_TASK: 3, LIMITED: 2})

    for args, code, says in (
        (["-f"], 2, "-f/--force goes only with --drop TASK_NAME"),
        (["--drop", " "], 2, "expected a task name"),
        (["--drop", "tests.delay.eta_tsak", "-f"], 1,
         "tests.delay.eta_tsak: no task of this app has that name"),
    ):  # fmt: skip
        refused = celery(cluster, "extras", "delayed", *args)
        assert refused.returncode == code and says in refused.stderr, (args, refused.stderr)
        assert "Traceback" not in refused.stderr
    asked = celery(cluster, "extras", "delayed", "--drop", ETA_TASK, answer="n\n")
    assert asked.returncode == 1 and "drop 3 parked tasks of tests.delay.eta_task" in asked.stdout
    assert parked(cluster) == {ETA_TASK: 3, LIMITED: 2}
    done = celery(cluster, "extras", "delayed", "--drop", ETA_TASK, "-f")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"Dropped 3 parked tasks of {ETA_TASK} from the delay store.\n"
    again = celery(cluster, "extras", "delayed", "--drop", ETA_TASK, "-f", "--json")
    assert again.stdout.strip() == f'{{"task": "{ETA_TASK}", "dropped": 0}}', again.stdout
    assert parked(cluster) == {LIMITED: 2}

    assert cluster.app.control.purge() == 2  # the broker's queue is empty: the 2 parked
    assert time.time() < due - 1.0, "dropped too late to tell: raise AHEAD"
    assert parked(cluster) == {}
    assert ran_alone(journal, cluster, "canary", due + 3.0) == ["canary"]
