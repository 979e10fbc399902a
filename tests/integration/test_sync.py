"""Durable, synced revokes on real workers (Redis, and RabbitMQ with the Redis store).

Each test shows one promise of the sync capability with tasks that must not
run: the journal lists what ran, the result backend what was discarded.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp.exceptions
import pytest
import redis

from celery_extras.store.client import redis_client, store_key
from celery_extras.sync import RevokeStore, record_revokes
from celery_extras.sync.revoke_store import shard_of
from celery_extras.sync.syncer import HELLO
from tests.integration.conftest import Cluster, also_on_redis_cluster
from tests.support import proj
from tests.support.brokers import free_port
from tests.support.journal import Journal
from tests.support.outages import store_outages, store_recoveries
from tests.support.revokes import write_raw_entry
from tests.support.workers import ROOT, WorkerProcess, wait_for

INTERVAL = 1.0


def revoked_on(cluster: Cluster, worker: WorkerProcess, limit: int = 1000) -> dict[str, Any]:
    """The ``extras_revoked`` reply of one worker (its ids, stamps and sync state)."""
    replies = cluster.app.control.broadcast(
        "extras_revoked", arguments={"limit": limit}, destination=[worker.hostname],
        reply=True, timeout=2.0, limit=1,
    )  # fmt: skip
    for reply in replies or []:
        if worker.hostname in reply:
            answer: dict[str, Any] = reply[worker.hostname]
            return answer
    return {}


def holds(cluster: Cluster, worker: WorkerProcess, task_id: str) -> bool:
    return task_id in revoked_on(cluster, worker).get("ids", [])


def store_of(cluster: Cluster) -> RevokeStore:
    return RevokeStore(redis_client(cluster.app), store_key(cluster.app), 50000)


def in_store(cluster: Cluster, task_id: str) -> bool:
    store = store_of(cluster)
    return store.client.zscore(store.shard_keys[shard_of(task_id)][0], task_id) is not None


def tags(journal: Journal) -> list[Any]:
    return sorted(str(e["tag"]) for e in journal.entries())


def wait_revoked(cluster: Cluster, *task_ids: str) -> None:
    """Until the worker has discarded each task (it marks them REVOKED in the backend)."""
    for task_id in task_ids:
        result = cluster.app.AsyncResult(task_id)
        wait_for(lambda r=result: r.state == "REVOKED", timeout=60, what=f"{task_id} REVOKED")


@also_on_redis_cluster("rabbitmq")
def test_revokes_sent_while_no_worker_runs_are_honoured(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    app = cluster.configure(extras_sync_interval=INTERVAL)
    by_id, by_stamp = f"rid-{uuid.uuid4()}", f"batch-{uuid.uuid4().hex[:8]}"
    app.control.revoke(by_id)
    app.AsyncResult(f"rid2-{by_id}").revoke()
    app.control.revoke_by_stamped_headers({"batch": [by_stamp]})
    # malformed store contents must be dropped and logged, not crash the worker
    store = store_of(cluster)
    write_raw_entry(store, 0, "x" * 300, time.time() + 600)
    write_raw_entry(store, 1, "not json", time.time() + 600, stamp=True)

    send("tests.noop", "revoked-by-id", task_id=by_id)
    send("tests.noop", "revoked-by-id-2", task_id=f"rid2-{by_id}")
    stamped = send("tests.noop", "revoked-by-stamp", stamped_headers=["batch"], batch=by_stamp)
    send("tests.noop", "other-stamp", stamped_headers=["batch"], batch="another")
    kept = send("tests.noop", "kept")

    worker = cluster.worker("w1")
    assert kept.get(timeout=60) == "kept"
    wait_revoked(cluster, by_id, f"rid2-{by_id}", stamped.id)
    wait_for(lambda: "other-stamp" in tags(journal), what="the other stamp to run")
    assert tags(journal) == ["kept", "other-stamp"]
    log = worker.log()
    assert f"Discarding revoked task: tests.noop[{by_id}]" in log
    assert "dropped 2 malformed revoke entries from store" in log
    assert "mingle: searching for neighbors" not in log


def test_plain_celery_runs_a_task_revoked_while_no_worker_ran(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """The same scenario without celery-extras: the revoke is lost (why the capability exists)."""
    app = cluster.configure(plain=True)
    task_id = f"rid-{uuid.uuid4()}"
    app.control.revoke(task_id)
    result = send("tests.noop", "revoked-but-ran", task_id=task_id)
    cluster.worker("plain")
    assert result.get(timeout=60) == "revoked-but-ran"


#: Saves a worker state file holding one revoked id, as Celery's ``--statedb`` does at exit.
SAVE_STATEDB = """
import sys
from celery.worker import state
state.revoked.add(sys.argv[2])
persistent = state.Persistent(state, sys.argv[1])
persistent.save()
persistent.close()
"""


def test_ids_celery_loads_from_its_statedb_are_written_to_the_store(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.configure(extras_sync_interval=INTERVAL)
    statedb, saved = tmp_path / "w1.state", f"saved-{uuid.uuid4()}"
    subprocess.run([sys.executable, "-c", SAVE_STATEDB, str(statedb), saved], check=True)
    worker = cluster.worker("w1", args=[f"--statedb={statedb}"])
    wait_for(lambda: in_store(cluster, saved), timeout=30, what="the statedb's id in the store")
    assert holds(cluster, worker, saved)


def test_sigkilled_worker_restarted_honours_every_earlier_revoke(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    app = cluster.configure(extras_sync_interval=INTERVAL)
    worker = cluster.worker("w1")
    ids = [f"k{i}-{uuid.uuid4()}" for i in range(5)]
    app.control.revoke(ids[:3])
    app.control.revoke_by_stamped_headers({"tenant": "t-killed"})
    # a revoke from a client without celery-extras: only broadcast, never stored by the
    # client; the worker that received it writes it to the store itself.
    app.control.broadcast("revoke", arguments={"task_id": ids[3:]})
    wait_for(lambda: all(in_store(cluster, i) for i in ids), timeout=30,
             what="the broadcast-only revokes to reach the store")  # fmt: skip
    worker.kill()

    for i, task_id in enumerate(ids):
        send("tests.noop", f"revoked-{i}", task_id=task_id)
    stamped = send("tests.noop", "revoked-stamp", stamped_headers=["tenant"], tenant="t-killed")
    kept = send("tests.noop", "kept")
    cluster.worker("w1")
    assert kept.get(timeout=60) == "kept"
    wait_revoked(cluster, *ids, stamped.id)
    assert tags(journal) == ["kept"]


@also_on_redis_cluster("redis")
def test_worker_that_missed_a_broadcast_converges_without_restart(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    ns = cluster.ns
    app = cluster.configure(extras_sync_interval=INTERVAL)
    w1 = cluster.worker("w1")
    w2 = cluster.worker("w2", queues=(f"{ns}.w2",))

    # 1. a revoke written only to the store (the broadcast "lost" for everyone)
    only_stored = f"stored-{uuid.uuid4()}"
    record_revokes(app, [only_stored])
    wait_for(lambda: holds(cluster, w2, only_stored), timeout=30, what="w2 to pull it")

    # 2. while w2 is stopped (SIGSTOP), a revoke from a client without celery-extras (a
    # bare broadcast, never stored by the client) reaches w1 only (w2's copy is lost:
    # destination=w1). w1 writes it to the store; w2 catches up from there once resumed.
    while_paused = f"paused-{uuid.uuid4()}"
    w2.pause()
    try:
        app.control.broadcast(
            "revoke", arguments={"task_id": while_paused}, destination=[w1.hostname]
        )
        wait_for(lambda: in_store(cluster, while_paused), timeout=30, what="w1 to store it")
    finally:
        w2.resume()
    wait_for(lambda: holds(cluster, w2, while_paused), timeout=30, what="w2 to converge")
    assert w2.ready_count() == 1 and w1.ready_count() == 1  # no restart
    assert f"flagged as revoked: {while_paused}" in w1.log()
    assert while_paused not in w2.log()  # w2 never received the broadcast

    for task_id in (only_stored, while_paused):
        send("tests.noop", task_id, task_id=task_id, queue=f"{ns}.w2")
    assert send("tests.noop", "kept", queue=f"{ns}.w2").get(timeout=60) == "kept"
    wait_revoked(cluster, only_stored, while_paused)
    assert tags(journal) == ["kept"]

    # `celery extras revoked` lists both, in the store and on each worker
    listing = json.loads(cli(cluster, "extras", "revoked", "--json", "--limit", "50").stdout)
    assert set(listing["store"]["newest_ids"]) == {only_stored, while_paused}
    assert listing["store"]["ids"] == 2
    for worker in (w1, w2):
        held = listing["workers"][worker.hostname]
        assert {only_stored, while_paused} <= set(held["ids"])
        assert held["sync"]["store"] == "ok"
    text = cli(cluster, "extras", "revoked").stdout
    assert "store: 2 ids, 0 stamps" in text and f"{w2.hostname}: " in text


def cli(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    env = proj.worker_env(cluster.broker, cluster.ns, cluster.conf, cluster.include)
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.support.proj", *argv],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def clock_of(cluster: Cluster, worker: WorkerProcess) -> int:
    replies = cluster.app.control.inspect(destination=[worker.hostname], timeout=2).clock()
    value: int = (replies or {})[worker.hostname]["clock"]
    return value


def test_new_worker_clock_exceeds_every_clock_it_heard_of(cluster: Cluster) -> None:
    # a long interval: w1 does not write its clock to the store in between, so w2 can
    # only learn it from w1's reply to its hello
    app = cluster.configure(extras_sync_interval=60.0)
    w1 = cluster.worker("w1")
    app.control.broadcast(HELLO, arguments={"from_node": "test", "clock": 9000},
                          destination=[w1.hostname], reply=True, timeout=2)  # fmt: skip
    w1_clock = clock_of(cluster, w1)
    store_clock = store_of(cluster).counts()["clock"]
    assert w1_clock > 9000 > store_clock

    w2 = cluster.worker("w2")
    wait_for(lambda: w1.hostname in revoked_on(cluster, w2).get("sync", {}).get("neighbours", []),
             timeout=30, what="w2 to hear w1's hello reply")  # fmt: skip
    assert clock_of(cluster, w2) > w1_clock

    # the store's clock: written by a client whose clock is far ahead
    app.clock.value = 20000
    record_revokes(app, [f"clock-{uuid.uuid4()}"])
    assert store_of(cluster).counts()["clock"] == 20001
    w3 = cluster.worker("w3")
    assert clock_of(cluster, w3) > 20001


@contextlib.contextmanager
def private_redis(port: int, workdir: Path) -> Iterator[redis.Redis[str]]:
    """A redis-server of this test only, on *port*; stopped on exit."""
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port, decode_responses=True)
    try:
        wait_for(lambda: _pings(client), timeout=20, what="private redis-server")
        yield client
    finally:
        proc.terminate()
        proc.wait(10)


def _pings(client: redis.Redis[str]) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_store_down_at_start_worker_starts_and_catches_up(
    cluster: Cluster, send: Callable[..., Any], journal: Journal, tmp_path: Path
) -> None:
    port = free_port()
    app = cluster.configure(
        extras_sync_interval=INTERVAL, extras_redis_url=f"redis://127.0.0.1:{port}/0"
    )
    worker = cluster.worker("w1")  # nothing listens on the store's port yet
    (outage,) = store_outages(worker.log(), "revoke store")
    assert "the store failed (ConnectionError: " in outage
    with private_redis(port, tmp_path):
        task_id = f"late-{uuid.uuid4()}"
        record_revokes(app, [task_id])  # written to the store only, never broadcast
        wait_for(lambda: holds(cluster, worker, task_id), timeout=30, what="catch-up")
        send("tests.noop", "revoked", task_id=task_id)
        assert send("tests.noop", "kept").get(timeout=60) == "kept"
        wait_revoked(cluster, task_id)
        assert tags(journal) == ["kept"]
        assert store_recoveries(worker.log())


def _pidbox_exists(cluster: Cluster, worker: WorkerProcess) -> bool:
    """Whether the worker's pidbox queue exists (it is exclusive: locked while it does)."""
    queue = f"{worker.hostname}.{cluster.app.conf.control_exchange}.pidbox"
    with cluster.app.connection_for_write() as conn:
        try:
            conn.default_channel.queue_declare(queue=queue, passive=True)
        except amqp.exceptions.NotFound:
            return False
        except amqp.exceptions.ResourceLocked:
            return True
    return True


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_partitioned_worker_converges_after_the_broker_dropped_it(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """A real partition, on RabbitMQ only: a SIGSTOPped worker misses its heartbeats, the
    broker closes its connection and deletes its pidbox queue, so broadcasts sent then are
    lost for it. (On Redis the broadcast is pub/sub, buffered for a stopped client.)"""
    app = cluster.configure(extras_sync_interval=INTERVAL, broker_heartbeat=2)
    worker = cluster.worker("w1")
    assert _pidbox_exists(cluster, worker)
    stored, bare = f"stored-{uuid.uuid4()}", f"bare-{uuid.uuid4()}"
    worker.pause()
    try:
        wait_for(lambda: not _pidbox_exists(cluster, worker), timeout=60, interval=0.5,
                 what="the broker to drop the stopped worker")  # fmt: skip
        app.control.revoke(stored)  # stored, and broadcast to nobody
        app.control.broadcast("revoke", arguments={"task_id": bare})  # lost
    finally:
        worker.resume()
    wait_for(lambda: holds(cluster, worker, stored), timeout=60, what="w1 to converge")
    assert "Connection to broker lost" in worker.log() and worker.ready_count() == 1
    assert bare not in worker.log() and stored not in worker.log()  # neither broadcast arrived
    send("tests.noop", "revoked", task_id=stored)
    assert send("tests.noop", "kept").get(timeout=60) == "kept"
    wait_revoked(cluster, stored)
    assert tags(journal) == ["kept"]
