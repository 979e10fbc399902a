"""SIGKILL a worker in the middle of limited, retried and weighted work with acks_late: nothing
is lost. The workers consume two queues by weight, so every task goes through the fair
consumer: limited and retried tasks in one queue, plain ones in the other."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.integration.conftest import MUTEX_EXPIRE, Cluster, restartable_cluster
from tests.support.brokers import Restartable
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_reliability",)


def done_ids(journal: Journal) -> Counter[str]:
    return Counter(e["id"] for e in journal.entries() if e.get("outcome") == "done")


@pytest.mark.exclusive
@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_sigkill_mid_run_loses_no_limited_retried_or_weighted_task(
    kind: str, ns: str, tmp_path: Path, journal: Journal
) -> None:
    # a private Redis whose append-only file tells deliveries kombu's transport lost in
    # flight to the killed worker (see lost_in_transit) from ours
    with restartable_cluster(kind, ns, tmp_path) as (cluster, broker):
        kill_mid_run(cluster, journal, broker)


def kill_mid_run(cluster: Cluster, journal: Journal, broker: Restartable) -> None:
    queues = (cluster.ns, f"{cluster.ns}.b")
    cluster.configure(
        include=INCLUDE,
        task_acks_late=True,
        extras_queue_weights={queues[0]: 3, queues[1]: 1},
        broker_transport_options={  # Redis: hand a dead worker's messages back after 5 s
            "visibility_timeout": 5,
            "unacked_restore_interval": 1,
            "unacked_mutex_expire": MUTEX_EXPIRE,
        },
    )
    send = cluster.app.send_task
    w1 = cluster.worker("w1", queues=queues)
    w2 = cluster.worker("w2", queues=queues)
    ids = [send("tests.reliability.limited", (i,)).id for i in range(40)]
    ids += [send("tests.reliability.retried", (i,)).id for i in range(20)]
    ids += [send("tests.reliability.weighted", (i,), queue=queues[1]).id for i in range(60)]

    wait_for(lambda: len(done_ids(journal)) >= 15, timeout=60, what="the run to be under way")
    w1.kill()  # mid-run: tasks held for tokens, prefetched, retrying and running die with it
    cluster.worker("w3", queues=queues)

    def settled() -> tuple[Counter[str], Counter[str]] | None:
        done, lost = done_ids(journal), broker.lost_in_transit()
        return (done, lost) if set(ids) - done.keys() <= lost.keys() else None

    done, lost = wait_for(settled, timeout=120, interval=0.5,
                          what="every task to complete after the SIGKILL")  # fmt: skip
    duplicates = sum(n - 1 for n in done.values())
    print(f"\n{cluster.broker.split(':')[0]}: {len(done.keys() & set(ids))} of 120 tasks done, "
          f"{sum(lost.values())} lost in the Redis transport on their way to the killed "
          f"worker, {duplicates} ran twice")  # fmt: skip
    # Every task that reached a worker ran. Redis's transport may lose what the killed
    # worker's BRPOP popped as it died, before it had it: one per queue it consumed.
    assert sum(lost.values()) <= len(queues), f"more than one message per queue lost: {lost}"
    assert w2.alive()


@pytest.mark.parametrize("pool", ["eventlet", "gevent"])
def test_a_killed_workers_messages_come_back_to_a_green_pool_worker_seed_120364(
    pool: str, ns: str, tmp_path: Path, journal: Journal
) -> None:
    """On the Redis broker, a SIGKILLed worker's unacked messages come back to a worker of
    a green pool that was already running (chaos seed 120364: kombu restores them from a
    timer of the event loop, which gevent and eventlet run without; before
    ``RedisRestoreGuard`` they waited for the next worker's start)."""
    with restartable_cluster("redis", ns, tmp_path) as (cluster, broker):
        cluster.configure(
            include=INCLUDE,
            task_acks_late=True,
            broker_transport_options={
                "visibility_timeout": 3,
                "unacked_restore_interval": 1,
                "unacked_restore_throttle": 1,
                "unacked_mutex_expire": MUTEX_EXPIRE,
            },
        )
        w1 = cluster.worker("w1", pool=pool)
        w2 = cluster.worker("w2", pool=pool)
        ids = [cluster.app.send_task("tests.reliability.weighted", (i,)).id for i in range(300)]
        wait_for(lambda: len(done_ids(journal)) >= 30, timeout=60, what="the run to be under way")
        w1.kill()  # its prefetched and running messages stay unacked in Redis

        def settled() -> Counter[str] | None:
            done, lost = done_ids(journal), broker.lost_in_transit()
            return done if set(ids) - done.keys() <= lost.keys() else None

        done = wait_for(settled, timeout=60, interval=0.5,
                        what="the killed worker's messages to run on the other")  # fmt: skip
        assert len(set(ids) - done.keys()) <= 1  # at most the one kombu lost in its pop
        assert w2.alive()
