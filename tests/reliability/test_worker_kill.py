"""SIGKILL a worker in the middle of limited, retried and weighted work with acks_late: nothing
is lost. The workers consume two queues by weight, so every task goes through the fair
consumer: limited and retried tasks in one queue, plain ones in the other."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_reliability",)


def done_ids(journal: Journal) -> Counter[str]:
    return Counter(e["id"] for e in journal.entries() if e.get("outcome") == "done")


def test_sigkill_mid_run_loses_no_limited_retried_or_weighted_task(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    queues = (cluster.ns, f"{cluster.ns}.b")
    cluster.configure(
        include=INCLUDE,
        task_acks_late=True,
        extras_queue_weights={queues[0]: 3, queues[1]: 1},
        broker_transport_options={  # Redis: hand a dead worker's messages back after 5 s
            "visibility_timeout": 5,
            "unacked_restore_interval": 1,
        },
    )
    w1 = cluster.worker("w1", queues=queues)
    w2 = cluster.worker("w2", queues=queues)
    ids = [send("tests.reliability.limited", i).id for i in range(40)]
    ids += [send("tests.reliability.retried", i).id for i in range(20)]
    ids += [send("tests.reliability.weighted", i, queue=queues[1]).id for i in range(60)]

    wait_for(lambda: len(done_ids(journal)) >= 15, timeout=60, what="the run to be under way")
    w1.kill()  # mid-run: tasks held for tokens, prefetched, retrying and running die with it
    cluster.worker("w3", queues=queues)

    done = wait_for(
        lambda: (d := done_ids(journal)).keys() >= set(ids) and d,
        timeout=120,
        interval=0.5,
        what="every task to complete after the SIGKILL",
    )
    duplicates = sum(n - 1 for n in done.values())
    print(f"\n{cluster.broker.split(':')[0]}: 120 tasks, all done; {duplicates} ran twice")
    assert set(done) == set(ids)
    assert w2.alive()
