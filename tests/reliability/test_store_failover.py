"""The store behind Sentinel: SIGKILL its master in the middle of limited, retried and revoked
work. The workers carry on against the promoted replica, no task is lost, no revoked task
runs, and the global limit holds once the failover is done.

The store is a private master + replica + 3 Sentinels (tests/support/topology.py, short
``down-after-milliseconds``); the broker and the journal stay on the shared Redis.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis

from celery_extras.store.client import redis_client, store_key
from celery_extras.sync import RevokeStore, record_revokes
from celery_extras.sync.revoke_store import shard_of
from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.rates import busiest_second
from tests.support.topology import SentinelTopology
from tests.support.workers import WorkerProcess, wait_for

#: Timing is asserted here (rates, latencies): under pytest-xdist these tests run alone.
pytestmark = pytest.mark.exclusive

INCLUDE = ("tests.support.tasks_reliability",)
LIMITED = "tests.reliability.limited"  # 10/s, burst 2, global, acks_late
RATE, BURST = 10, 2
#: Seconds, beyond the Sentinels' own failover time, for the workers to carry on.
CARRY_ON = 5.0


def revoked_on(cluster: Cluster, worker: WorkerProcess) -> set[str]:
    replies = cluster.app.control.broadcast(
        "extras_revoked", arguments={"limit": 1000}, destination=[worker.hostname],
        reply=True, timeout=2.0, limit=1,
    )  # fmt: skip
    for reply in replies or []:
        if worker.hostname in reply:
            return set(reply[worker.hostname].get("ids", []))
    return set()


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_sentinel_failover_mid_work_loses_nothing_and_keeps_revokes_and_limit(
    cluster: Cluster, journal: Journal, sentinel: SentinelTopology
) -> None:
    app = cluster.configure(
        include=INCLUDE,
        extras_redis_url=sentinel.url,
        extras_redis_options=sentinel.options,
        extras_sync_interval=0.5,
    )
    send = app.send_task
    workers = [cluster.worker("w1"), cluster.worker("w2")]

    # revoked before the failover, through the ordinary API (store and broadcast)
    revoked_before = [f"rev-before-{uuid.uuid4()}" for _ in range(10)]
    app.control.revoke(revoked_before)
    expected: list[str] = []
    for i in range(60):
        expected.append(send(LIMITED, (f"a{i}",)).id)
        if i % 6 == 0:
            send(LIMITED, (f"revoked-{i}",), task_id=revoked_before[i // 6])
    expected += [send("tests.reliability.retried", (f"r{i}",)).id for i in range(10)]
    expected += [send("tests.reliability.retried_per_item", (f"item-{i}", 3)).id for i in range(10)]

    def done() -> Counter[str]:
        return Counter(e["id"] for e in journal.entries() if e["outcome"] == "done")

    wait_for(lambda: len(done()) >= 15, timeout=60, what="the work to be under way")
    killed = sentinel.kill_master()
    killed_at = time.time()
    failover = sentinel.wait_failover(killed)
    promoted_at = time.time()

    # revoked after the failover, in the store only (no broadcast): the workers can only
    # learn it from the new master
    revoked_after = [f"rev-after-{uuid.uuid4()}" for _ in range(5)]
    record_revokes(app, revoked_after)
    for worker in workers:
        wait_for(
            lambda w=worker: set(revoked_after) <= revoked_on(cluster, w),
            timeout=CARRY_ON + 30, interval=0.2, what=f"{worker.name} to read the new master",
        )  # fmt: skip
    synced_after = time.time() - promoted_at
    for i, task_id in enumerate(revoked_after):
        send(LIMITED, (f"revoked-after-{i}",), task_id=task_id)
    expected += [send(LIMITED, (f"b{i}",)).id for i in range(40)]
    # the limit books its slots on the new master again
    new_master = redis.Redis(port=sentinel.master_port(), decode_responses=True)
    bucket = f"{cluster.ns}:bucket:{LIMITED}:"
    wait_for(lambda: new_master.exists(bucket), timeout=CARRY_ON, interval=0.05,
             what="the limit to book on the new master")  # fmt: skip

    try:
        wait_for(lambda: set(expected) <= done().keys(), timeout=90, interval=0.5,
                 what="every task to run")  # fmt: skip
    except AssertionError:
        missing = set(expected) - done().keys()
        seen = {e["id"]: e for e in journal.entries() if e["id"] in missing}
        logs = "\n".join(w.log()[-3000:] for w in workers)
        raise AssertionError(f"{len(missing)} tasks did not run: {seen}\n{logs}") from None
    entries = journal.entries()
    ran = {e["id"] for e in entries}
    assert not ran & set(revoked_before + revoked_after), "a revoked task ran"
    limited = [e for e in entries if e["task"] == LIMITED]
    assert Counter(e["id"] for e in limited).most_common(1)[0][1] == 1  # none ran twice
    first_after = min(e["t"] for e in limited if e["t"] > promoted_at)
    # the limit after the failover: rate + burst at most in any second
    after = sorted(e["t"] for e in limited if e["t"] >= promoted_at)
    report: dict[str, Any] = {
        "failover_s": round(failover, 2),
        "kill_to_promoted_s": round(promoted_at - killed_at, 2),
        "revoke_synced_after_promotion_s": round(synced_after, 2),
        "first_limited_after_promotion_s": round(first_after - promoted_at, 2),
        "busiest_second_after": busiest_second(after),
        "busiest_second_overall": busiest_second(sorted(e["t"] for e in limited)),
    }
    print("failover:", report)
    assert synced_after <= CARRY_ON, report
    assert first_after - promoted_at <= CARRY_ON, report
    assert busiest_second(after) <= RATE + BURST, report
    for worker in workers:
        assert worker.alive()


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_revoke_the_store_lost_is_written_back_by_the_worker_that_holds_it(
    cluster: Cluster,
) -> None:
    """What a failover can do to an unreplicated write, done by hand: the revoke's shard goes
    back to before it (entry, change-log line and sequence number gone, same epoch). The
    worker that held it sees the shard behind its cursor and writes it back."""
    app = cluster.configure(extras_sync_interval=0.5)
    worker = cluster.worker("w1")
    task_id = f"lost-{uuid.uuid4()}"
    record_revokes(app, [task_id])
    wait_for(lambda: task_id in revoked_on(cluster, worker), timeout=30, what="w1 to pull it")

    store = RevokeStore(redis_client(app), store_key(app), 1000)
    revoked, _stamps, log, seq = store.shard_keys[shard_of(task_id)][:4]
    client = store.client
    client.zrem(revoked, task_id)
    client.zrem(log, f"i:{task_id}")
    client.decr(seq)
    assert client.zscore(revoked, task_id) is None
    wait_for(lambda: client.zscore(revoked, task_id) is not None, timeout=15, interval=0.2,
             what="w1 to write the lost revoke back")  # fmt: skip
    assert worker.alive()
