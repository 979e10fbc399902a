"""The store on a Redis Cluster beside a single Redis: acquire latency and limit accuracy.

* Global acquire p50: one bucket script call (:class:`GlobalTokenBucket.reserve`) on the
  shared single Redis, on a private 3-master Redis Cluster, and on a Redis behind
  Sentinel (master + replica + 3 Sentinels), all on loopback.
* Park p50 on the Sentinel set: one delay-store park without ``WAIT`` and with
  ``WAIT 1`` (the default there, ``extras_delay_park_replicas``), pipelined in one
  round trip, and what a park costs while the replica is cut off (the wait, then the
  withdrawal). ``python -m bench.store parks`` prints these rows alone.
* Accuracy: 6 workers (prefork, concurrency 2) share a ``5/s`` per-key global limit
  over 6 keys, two on each master of the cluster, 40 tasks per key queued: the
  worst key's steady rate and the busiest second of any key.

The cluster and Sentinel servers are started here, on free ports from 7100 up, and
stopped before the function returns (tests/support/topology.py).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis
from celery import Task, shared_task

from celery_extras import limit
from celery_extras.delay.entry import Entry
from celery_extras.delay.redis_store import ParkNotReplicated, RedisDelayStore, delay_keys
from celery_extras.limits.redis_bucket import GlobalTokenBucket
from celery_extras.store.client import connect
from tests.support import proj
from tests.support.brokers import REDIS_URL, require_broker
from tests.support.journal import Journal
from tests.support.topology import (
    RedisClusterTopology,
    SentinelTopology,
    redis_cluster,
    redis_sentinel,
)
from tests.support.workers import WorkerProcess, wait_for

from .table import Row

__all__ = ["measure", "park_rows"]

INCLUDE = ("bench.store",)
TASK = "bench.store.per_key"
KEY_RATE, WORKERS, KEYS, PER_KEY = 5.0, 6, 6, 40


@limit("5/s", burst=1, scope="global", key=lambda args, kwargs: args[0])
@shared_task(bind=True, name=TASK)
def per_key(self: Task, key: str, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, key=key, tag=tag)


def acquire_p50_ms(client: Any, calls: int = 3000) -> float:
    """p50 latency of one global acquire (one script call), in ms."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    bucket = GlobalTokenBucket(client, prefix)
    for _ in range(50):
        bucket.reserve("bench", 1e6, 10**5)
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        bucket.reserve("bench", 1e6, 10**5)
        samples.append((time.perf_counter_ns() - start) / 1e6)
    client.delete(bucket.bucket_key("bench"))
    return statistics.median(samples)


def _park_p50_ms(store: RedisDelayStore, calls: int) -> float:
    """p50 latency of one park of a fresh entry (a 200-byte body), in ms."""
    body = b"[[" + b"1, " * 60 + b"1], {}, {}]"
    samples = []
    for i in range(calls + 50):
        entry = Entry(task="bench.park", task_id=f"t{i}", kind="limit", body=body,
                      content_type="application/json", content_encoding="utf-8",
                      headers={"id": f"t{i}", "task": "bench.park"})  # fmt: skip
        start = time.perf_counter_ns()
        store.park(f"e{i}", entry, 3600.0)
        if i >= 50:
            samples.append((time.perf_counter_ns() - start) / 1e6)
    store.client.delete(*store.keys.values())
    return statistics.median(samples)


def park_rows(sentinel: SentinelTopology, calls: int = 2000) -> list[Row]:
    """Park p50 without and with ``WAIT 1`` on *sentinel*, and a park with the replica cut off."""
    client = connect(sentinel.url, sentinel.options)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    no_wait = _park_p50_ms(RedisDelayStore(client, prefix), calls)
    waited = _park_p50_ms(RedisDelayStore(client, prefix, replicas=1), calls)
    store = RedisDelayStore(client, prefix, replicas=1, replica_wait=1.0)
    replica = sentinel.replica_port()
    sentinel.pause(replica)
    try:
        redis.Redis(port=sentinel.master_port()).client_kill_filter(_type="replica")
        start = time.perf_counter()
        with contextlib.suppress(ParkNotReplicated):
            store.park("cut", Entry("bench.park", "cut", "limit", b"[]", "application/json",
                                    "utf-8"), 3600.0)  # fmt: skip
        cut_ms = (time.perf_counter() - start) * 1000
    finally:
        sentinel.resume(replica)
    client.delete(*delay_keys(prefix).values())
    client.close()
    return [
        Row("delay park p50, Sentinel, no WAIT", "ms", None, no_wait, "<= 0.5", no_wait <= 0.5,
            runs=calls, note="extras_delay_park_replicas = 0"),
        Row("delay park p50, Sentinel, WAIT 1 (default there)", "ms", None, waited,
            "<= 2x no WAIT", waited <= 2 * no_wait, runs=calls,
            note="script + WAIT pipelined; loopback replica"),
        Row("delay park, replica cut off: time to fail", "ms", None, cut_ms, "~ 1000",
            900 <= cut_ms <= 1500, note="extras_delay_park_wait, then withdrawn; tried again "
            "every 5 s per process"),
    ]  # fmt: skip


def keys_on_every_master(topology: RedisClusterTopology, ns: str) -> list[str]:
    """Two limit keys per master: their buckets' slots are served by each master in turn."""
    client = topology.client()
    by_port: dict[int, list[str]] = defaultdict(list)
    n = 0
    while min((len(by_port[p]) for p in topology.ports), default=0) < KEYS // len(topology.ports):
        key = f"customer-{n}"
        port = client.get_node_from_key(f"{ns}:bucket:{TASK}:{key}").port
        if len(by_port[port]) < KEYS // len(topology.ports):
            by_port[port].append(key)
        n += 1
    client.close()
    return [k for p in topology.ports for k in by_port[p]]


def accuracy(topology: RedisClusterTopology, logdir: Path) -> tuple[float, float, int]:
    """(worst key rate, best key rate, busiest second of any key) for 6 workers."""
    broker = require_broker("redis")
    ns = f"bstore{uuid.uuid4().hex[:8]}"
    conf = {"extras_redis_url": topology.url}
    app = proj.make_app(broker, ns, conf, INCLUDE)
    env = proj.worker_env(broker, ns, conf, INCLUDE)
    journal = Journal(ns)
    keys = keys_on_every_master(topology, ns)
    workers = [WorkerProcess(f"w{i}", env, logdir / f"w{i}.log") for i in range(WORKERS)]
    try:
        for w in workers:
            w.start(wait=False)
        for w in workers:
            w.wait_ready(timeout=120)
        for i in range(PER_KEY):
            for key in keys:
                app.send_task(TASK, args=(key, i))
        total = PER_KEY * len(keys)
        wait_for(lambda: len(journal) >= total, timeout=PER_KEY / KEY_RATE * 4 + 60,
                 interval=0.5, what=f"{total} runs")  # fmt: skip
        by_key: dict[str, list[float]] = defaultdict(list)
        for e in journal.entries():
            by_key[e["key"]].append(e["t"])
        rates, busiest = [], 0
        for times in by_key.values():
            times.sort()
            rates.append((len(times) - 1) / (times[-1] - times[0]))
            busiest = max(busiest, max(sum(1 for s in times if t <= s < t + 1) for t in times))
        return min(rates), max(rates), busiest
    finally:
        for w in workers:
            w.stop()
        journal.clear()
        app.control.purge()
        app.close()


def measure() -> list[Row]:
    single = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    single_ms = acquire_p50_ms(single)
    single.close()
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        with redis_sentinel(Path(tmp) / "sentinel") as sentinel:
            client = connect(sentinel.url, sentinel.options)
            sentinel_ms = acquire_p50_ms(client)
            client.close()
            parks = park_rows(sentinel)
        with redis_cluster(Path(tmp) / "cluster") as topology:
            client = connect(topology.url, {})
            cluster_ms = acquire_p50_ms(client)
            client.close()
            worst, best, busiest = accuracy(topology, Path(tmp))
    return [
        Row("global acquire p50, single Redis", "ms", None, single_ms, "<= 0.3",
            single_ms <= 0.3, note="one Lua script call, loopback"),
        Row("global acquire p50, Redis Cluster (3 masters)", "ms", None, cluster_ms,
            "<= 2x single", cluster_ms <= 2 * single_ms, note="same script; client routes by slot"),
        Row("global acquire p50, Redis behind Sentinel", "ms", None, sentinel_ms,
            "<= 2x single", sentinel_ms <= 2 * single_ms, note="master + replica + 3 Sentinels"),
        *parks,
        Row("6 workers, 6 keys on 3 masters, 5/s each: worst key rate", "tasks/s", None, worst,
            "5 +- 5%", abs(worst - KEY_RATE) <= 0.05 * KEY_RATE,
            note=f"best key {best:.2f}/s; 40 tasks per key"),
        Row("same: busiest second of any key", "tasks", None, float(busiest), "<= 6",
            busiest <= KEY_RATE + 1, note="rate + burst"),
    ]  # fmt: skip


if __name__ == "__main__" and sys.argv[1:] == ["parks"]:
    from .table import render

    with (
        tempfile.TemporaryDirectory(prefix="bench-store-") as tmp,
        redis_sentinel(Path(tmp) / "sentinel") as topology,
    ):
        print(render(park_rows(topology)))
