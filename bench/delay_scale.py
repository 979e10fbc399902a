"""The delay store at scale: a million parked entries, and a Redis Cluster of 1 to 3 masters.

The store is driven directly, as :func:`bench.delay.cost_per_task` does (no workers); every
entry is a realistic Celery message: the protocol-2 headers ``app.amqp.as_task_v2`` builds,
the properties a Redis broker delivers with them, a small JSON body.

* **1,000,000 parked entries** on a private ``redis-server`` (no persistence), due 10 to
  70 min ahead: Redis memory per entry (``used_memory`` after minus before), and the latency
  of single :meth:`RedisDelayStore.park` calls, 20 in every 1,000 timed one by one (the rest
  go through a pipeline calling the same script). Then 50,000 more due now, released by one
  :class:`~celery_extras.delay.mover.Mover` (batch 100, lead 1 s) that publishes each through
  kombu (:func:`~celery_extras.delay.mover_thread.publish_entry`) to the same Redis; and
  50,000 more released with a publish that does nothing (the store's own ceiling).
* **Redis Cluster**, 12 shards (``extras_delay_shards = 12``): 60,000 entries parked on the
  3 masters the tests' helper creates (``redis-cli --cluster create``), counted per master;
  and the release rate of 30,000 entries due now with 1, 2 and 3 masters, one mover
  process per master (publish does nothing: the store is what is measured).

Every server is started here, on free loopback ports, and stopped before :func:`measure`
returns, whatever happens (``python -m bench.delay_scale`` runs this bench alone).
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import random
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celery_extras.delay.entry import Entry, entry_id
from celery_extras.delay.mover import Mover
from celery_extras.delay.mover_thread import publish_entry
from celery_extras.delay.redis_store import ALLOW_OOM, CLAIM, PARK, RELEASE, RedisDelayStore
from celery_extras.delay.shards import SLOTS, shard_of
from celery_extras.delay.store import Claim
from celery_extras.store.client import connect
from tests.support import topology as topologies
from tests.support.brokers import PrivateRedis
from tests.support.topology import RedisClusterTopology, redis_cluster

from .runs import cpu_seconds
from .table import Row

__all__ = ["measure"]

PARKED = 1_000_000
#: every CHUNK parks, SAMPLED of them are single timed ``park`` calls, the rest pipelined
CHUNK, SAMPLED = 1000, 20
SPREAD = (600.0, 4200.0)  # s: the million parked are due this far ahead (none during the run)
DUE = 50_000  # entries due now, released by one mover (real publish, then no-op)
BATCH, LEAD = 100, 1.0
SHARDS = 12
SPREAD_N = 60_000  # entries parked on the 3-master cluster and counted per master
SCALE_N = 30_000  # entries due now per release run on a cluster of 1, 2, 3 masters
SCALE_RUNS = 3  # release runs per cluster size (median)
#: the private clusters' ports: blocks probed from here up, away from the tests' blocks
#: (7100 + 1000 per pytest-xdist worker), as the test suite may run meanwhile
BENCH_BASE_PORT = 20100
QUEUE = "celery"
TASK = "proj.tasks.send_welcome_email"


# -- realistic entries ---------------------------------------------------------------------


class Messages:
    """Entries of one task's messages as Celery sends them: headers from
    ``app.amqp.as_task_v2``, the properties a Redis broker delivers, a small JSON body."""

    def __init__(self) -> None:
        app = Celery("proj", broker="memory://", set_as_current=False)
        sample = app.amqp.as_task_v2(str(uuid.uuid4()), TASK, args=(1, "a@example.com"),
                                     kwargs={"locale": "en"})  # fmt: skip
        self.headers: dict[str, Any] = dict(sample.headers)
        self.reply_to = str(app.thread_oid)
        app.close()

    def entry(self, i: int) -> tuple[str, Entry]:
        """``(entry id, entry)`` of the *i*-th message: a fresh task id, as parked for a
        rate limit (kind ``limit``)."""
        task_id = str(uuid.uuid4())
        args, kwargs = (48_213 + i, f"user{i}@example.com"), {"locale": "en"}
        headers = {**self.headers, "id": task_id, "root_id": task_id,
                   "argsrepr": repr(args), "kwargsrepr": repr(kwargs)}  # fmt: skip
        body = json.dumps([list(args), kwargs, {"callbacks": None, "errbacks": None,
                                                "chain": None, "chord": None}])  # fmt: skip
        entry = Entry(TASK, task_id, "limit", body.encode(), "application/json", "utf-8",
                      headers, {"correlation_id": task_id, "reply_to": self.reply_to,
                                "delivery_mode": 2, "priority": 0},
                      "", QUEUE, QUEUE)  # fmt: skip
        return entry_id(task_id, 0, "limit"), entry


def park_many(store: RedisDelayStore, items: Iterable[tuple[str, Entry, float]]) -> int:
    """Park *items* ``(entry id, entry, delay s)`` through one pipeline calling the store's
    own park script (as :meth:`RedisDelayStore.park` does, one round trip per CHUNK);
    how many were parked anew."""
    pipe: Any = store.client.pipeline(transaction=False)
    script: Any = store._park
    for eid, entry, delay in items:
        k = shard_of(eid, store.layout).keys
        args = [eid, max(0, math.ceil(delay * 1000)), json.dumps(entry.meta()), entry.dumps()]
        pipe.execute_command("EVALSHA", script.sha, 4, k["due"], k["meta"], k["msg"], k["parked"],
                             *script.args(args))  # fmt: skip
    return sum(int(r) for r in pipe.execute())


def release_all(mover: Mover, n: int, timeout: float = 300.0) -> float:
    """Turn *mover* until it has released *n* entries; seconds it took."""
    started = time.perf_counter()
    deadline = started + timeout
    while mover.counts["released"] < n:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"released {mover.counts['released']} of {n} in {timeout} s")
        before = mover.counts["claimed"]
        sleep = mover.run_once()
        if mover.counts["claimed"] == before:
            time.sleep(min(sleep, 0.05))
    return time.perf_counter() - started


# -- a million parked entries on one Redis -------------------------------------------------


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def million(workdir: Path) -> list[Row]:
    workdir.mkdir(parents=True, exist_ok=True)
    server = PrivateRedis(workdir, "--appendonly", "no")
    try:
        server.start()
        return _million(server.url)
    finally:
        server.stop()


def _million(url: str) -> list[Row]:
    client = redis.Redis.from_url(url, decode_responses=True)
    store = RedisDelayStore(client, "bench-scale")
    client.script_load(PARK)
    messages = Messages()
    rng = random.Random(7)
    keys = store.layout[0].keys
    before = _used_memory(client)
    latencies: list[float] = []
    pings: list[float] = []  # a PING after each timed park: the loopback round trip itself
    sizes: list[int] = []
    started = time.perf_counter()
    for base in range(0, PARKED, CHUNK):
        made = [(*messages.entry(base + i), rng.uniform(*SPREAD)) for i in range(CHUNK)]
        sizes.append(len(made[0][1].dumps()))
        assert park_many(store, made[SAMPLED:]) == CHUNK - SAMPLED
        for eid, entry, delay in made[:SAMPLED]:
            t = time.perf_counter()
            parked = store.park(eid, entry, delay)
            latencies.append(time.perf_counter() - t)
            assert parked
            t = time.perf_counter()
            client.ping()
            pings.append(time.perf_counter() - t)
    fill_s = time.perf_counter() - started
    assert client.zcard(keys["due"]) == PARKED
    per_entry = (_used_memory(client) - before) / PARKED
    usage = {name: int(client.memory_usage(keys[name], samples=0) or 0) / PARKED
             for name in ("due", "meta", "msg")}  # fmt: skip
    eid, entry = messages.entry(0)
    meta_bytes = len(json.dumps(entry.meta()))
    p50, p99 = (statistics.quantiles(latencies, n=100)[q] * 1e6 for q in (49, 98))
    ping50, ping99 = (statistics.quantiles(pings, n=100)[q] * 1e6 for q in (49, 98))
    server_us = float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    print(f"  parked {PARKED:,} in {fill_s:.0f} s; {per_entry:.0f} B/entry", flush=True)

    app = Celery("bench-scale", broker=url, set_as_current=False)
    try:
        real_rate, left_due = _release_rate(store, messages, PARKED,
                                          lambda e, c: publish_entry(app, e, c))  # fmt: skip
        due_queue = f"{QUEUE}.extras-due"
        published = int(client.llen(due_queue))
    finally:
        app.close()
    noop_rate, _ = _release_rate(store, messages, PARKED + DUE, lambda e, c: None)
    print(f"  release: {real_rate:,.0f}/s through kombu, {noop_rate:,.0f}/s no-op", flush=True)
    client.close()
    sampled = len(latencies)
    return [
        Row("1M parked: Redis memory per entry", "bytes", None, per_entry,
            "-", True,
            note=f"used_memory after minus before / {PARKED:,}; entry JSON (the message) "
                 f"{statistics.mean(sizes):.0f} B, meta JSON {meta_bytes} B, id {len(eid)} B: "
                 f"{per_entry - statistics.mean(sizes):.0f} B beyond the message; "
                 f"MEMORY USAGE per entry: due "
                 f"zset {usage['due']:.0f}, meta hash {usage['meta']:.0f}, msg hash "
                 f"{usage['msg']:.0f} B"),
        Row("1M parked: park latency p50", "us", None, p50, "<= 1000", p50 <= 1000,
            runs=sampled,
            note=f"single store.park calls ({SAMPLED} in every {CHUNK:,}, timed one by one "
                 "while the store filled up; the rest pipelined, whole fill "
                 f"{fill_s:.0f} s), private loopback Redis, client side; target: what "
                 "bench/delay allows a parked task's whole store work"),
        Row("1M parked: park latency p99", "us", None, p99, "-", True, runs=sampled,
            note=f"a PING after each: p50 {ping50:.0f}, p99 {ping99:.0f} us; the script "
                 f"itself {server_us:.0f} us a call in Redis (INFO commandstats, EVALSHA)"),
        Row("1M parked: release rate, kombu publish", "entries/s", None, real_rate, "-", True,
            note=f"{DUE:,} due now beside the 1M, one Mover (batch {BATCH}, lead {LEAD:g} s) "
                 f"publishing with publish_entry to the same Redis ({published:,} in "
                 f"{due_queue} after); with a no-op publish (the store's own ceiling, "
                 f"{DUE:,} more): {noop_rate:,.0f}/s; {left_due} left due"),
    ]  # fmt: skip


def _release_rate(store: RedisDelayStore, messages: Messages, first: int,
                  publish: Callable[[Entry, Claim], None]) -> tuple[float, int]:  # fmt: skip
    """Park DUE entries due now, release them with one mover; ``(entries/s, still due)``."""
    for base in range(first, first + DUE, CHUNK):
        assert park_many(store, ((*messages.entry(i), 0.0) for i in range(base, base + CHUNK)))
    mover = Mover(store, publish, batch=BATCH, lead=LEAD)
    elapsed = release_all(mover, DUE)
    assert mover.counts["publish_errors"] == mover.counts["invalid"] == 0, mover.counts
    due = int(store.client.zcount(store.layout[0].key("due"), "-inf",
                                  int(time.time() * 1000) + 1000))  # fmt: skip
    return mover.counts["released"] / elapsed, due


# -- Redis Cluster -------------------------------------------------------------------------


@contextlib.contextmanager
def _bench_ports() -> Iterator[None]:
    """The clusters started meanwhile take their ports from :data:`BENCH_BASE_PORT` up."""
    saved = topologies.BASE_PORT
    topologies.BASE_PORT = BENCH_BASE_PORT
    try:
        yield
    finally:
        topologies.BASE_PORT = saved


class SmallCluster(RedisClusterTopology):
    """The tests' cluster with any number of masters: ``redis-cli --cluster create`` wants
    3 or more, so each master is given its share of the slots (``CLUSTER ADDSLOTSRANGE``)
    and met by the others (``CLUSTER MEET``)."""

    def start(self) -> SmallCluster:
        for port in self.ports:
            self.servers.start(
                port, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
            )  # fmt: skip
        n = len(self.ports)
        for i, port in enumerate(self.ports):
            node: Any = redis.Redis(port=port, socket_timeout=5)
            node.execute_command("CLUSTER", "ADDSLOTSRANGE", i * SLOTS // n,
                                 (i + 1) * SLOTS // n - 1)  # fmt: skip
            if i:
                node.execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0])
            node.close()
        deadline = time.monotonic() + 30
        while not self._ok():
            if time.monotonic() > deadline:
                raise RuntimeError(f"a cluster of {n} masters did not cover every slot")
            time.sleep(0.1)
        return self


@contextlib.contextmanager
def small_cluster(workdir: Path, masters: int) -> Iterator[RedisClusterTopology]:
    topology = SmallCluster(workdir, masters)
    try:
        yield topology.start()
    finally:
        topology.stop()


def per_master(client: Any, store: RedisDelayStore) -> dict[int, int]:
    """Entries in the store's shards, by the port of the master holding each shard."""
    counts: dict[int, int] = defaultdict(int)
    for shard in store.layout:
        key = shard.key("due")
        counts[int(client.get_node_from_key(key).port)] += int(client.zcard(key))
    return dict(counts)


def spread(topology: RedisClusterTopology) -> tuple[dict[int, int], float]:
    """``(entries per master, largest deviation from even in %)`` of SPREAD_N entries."""
    client = connect(topology.url, {})
    try:
        store = RedisDelayStore(client, f"spread{uuid.uuid4().hex[:6]}", shards=SHARDS)
        messages, rng = Messages(), random.Random(11)
        client.script_load(PARK)
        made = [(*messages.entry(i), rng.uniform(*SPREAD)) for i in range(SPREAD_N)]
        assert store.park(*made[0])  # registers the shard count, as a worker's first park
        for base in range(1, SPREAD_N, CHUNK):
            park_many(store, made[base : base + CHUNK])
        counts = per_master(client, store)
    finally:
        client.close()
    assert sum(counts.values()) == SPREAD_N and len(counts) == len(topology.ports), counts
    even = SPREAD_N / len(topology.ports)
    return counts, max(abs(c - even) for c in counts.values()) / even * 100


def _mover_process(url: str, prefixes: list[str], start: Barrier, out: Any) -> None:
    """One mover process: for each store prefix in turn, once the parent has parked its
    entries (*start*), drains it with a mover (no-op publish) until a claim finds nothing
    due, and puts ``(released, publish errors, monotonic end, CPU seconds)`` on *out*."""
    client = connect(url, {})
    client.ping(target_nodes=redis.RedisCluster.ALL_NODES)  # connected to every master
    for prefix in prefixes:
        store = RedisDelayStore(client, prefix, shards=SHARDS)
        mover = Mover(store, lambda e, c: None, batch=BATCH, lead=LEAD)
        start.wait(300)
        cpu = time.process_time()
        while True:
            before = mover.counts["claimed"]
            mover.run_once()
            if mover.counts["claimed"] == before:
                break
        out.put((mover.counts["released"], mover.counts["publish_errors"], time.monotonic(),
                 time.process_time() - cpu))  # fmt: skip
    client.close()


@dataclass
class Release:
    """One release run on a cluster: entries/s, and CPU µs per entry of masters and movers."""

    rate: float
    redis_us: float
    mover_us: float


def release_runs(topology: RedisClusterTopology, made: list[tuple[str, Entry, float]],
                 movers: int, runs: int) -> list[Release]:  # fmt: skip
    """*runs* times: park *made* (due now) under a new prefix, and release them with *movers*
    mover processes (started once, for every run)."""
    prefixes = [f"scale{uuid.uuid4().hex[:6]}" for _ in range(runs)]
    servers = [proc.pid for proc in topology.servers.procs.values()]
    client = connect(topology.url, {})
    for text in (PARK, ALLOW_OOM + CLAIM, ALLOW_OOM + RELEASE):
        client.script_load(text)  # on every master, before any clock starts
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(movers + 1), ctx.Queue()
    procs = [ctx.Process(target=_mover_process, args=(topology.url, prefixes, start, out),
                         daemon=True) for _ in range(movers)]  # fmt: skip
    got: list[Release] = []
    try:
        for proc in procs:
            proc.start()
        for prefix in prefixes:
            store = RedisDelayStore(client, prefix, shards=SHARDS)
            assert store.park(*made[0])  # registers the shard count, as a worker's first park
            for base in range(1, len(made), CHUNK):
                park_many(store, made[base : base + CHUNK])
            start.wait(300)
            t0 = time.monotonic()
            redis_cpu = sum(cpu_seconds(pid) for pid in servers)
            results = [out.get(timeout=300) for _ in procs]
            redis_cpu = sum(cpu_seconds(pid) for pid in servers) - redis_cpu
            released = sum(r[0] for r in results)
            assert released == len(made) and not any(r[1] for r in results), results
            got.append(Release(released / (max(r[2] for r in results) - t0),
                               redis_cpu / released * 1e6,
                               sum(r[3] for r in results) / released * 1e6))  # fmt: skip
        for proc in procs:
            proc.join(30)
    finally:
        client.close()
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
    return got


def cluster_rows(workdir: Path) -> list[Row]:
    messages = Messages()
    made = [(*messages.entry(i), 0.0) for i in range(SCALE_N)]
    runs: dict[int, list[Release]] = {}
    with _bench_ports():
        with redis_cluster(workdir / "c3") as topology:
            counts, deviation = spread(topology)
            print(f"  3 masters: {counts}", flush=True)
            runs[3] = release_runs(topology, made, 3, SCALE_RUNS)
        for masters in (1, 2):
            with small_cluster(workdir / f"c{masters}", masters) as topology:
                runs[masters] = release_runs(topology, made, masters, SCALE_RUNS)
    even = SPREAD_N / 3
    rows = [
        Row("Redis Cluster, 3 masters: entries per master, deviation", "%", None, deviation,
            "within 10 %", deviation <= 10,
            note=f"{SPREAD_N:,} parked, {SHARDS} shards (4 a master): "
                 + ", ".join(f"{c:,}" for _, c in sorted(counts.items()))
                 + f" (even: {even:,.0f}); slots split by redis-cli --cluster create"),
    ]  # fmt: skip
    for masters in (1, 2, 3):
        got = runs[masters]
        print(f"  {masters} master(s): " + ", ".join(
            f"{r.rate:,.0f}/s (CPU/entry: Redis {r.redis_us:.0f} us, movers {r.mover_us:.0f} us)"
            for r in got), flush=True)  # fmt: skip
        plural = "s" if masters > 1 else ""
        cores = os.cpu_count() or 1
        cpu_us = statistics.median(r.redis_us + r.mover_us for r in got)
        rows.append(
            Row(f"release rate, {masters} master{plural}", "entries/s", None,
                statistics.median(r.rate for r in got), "-", True, runs=len(got),
                note=f"{SCALE_N:,} due now, {SHARDS} shards, {masters} mover process"
                     f"{'es' if masters > 1 else ''} (one per master, batch {BATCH}, lead "
                     f"{LEAD:g} s), no-op publish; runs "
                     f"{', '.join(f'{r.rate:,.0f}' for r in got)}; CPU per entry (median): "
                     f"Redis {statistics.median(r.redis_us for r in got):.0f} us, movers "
                     f"{statistics.median(r.mover_us for r in got):.0f} us, so "
                     f"{cores} cores release at most {cores * 1e6 / cpu_us:,.0f}/s")
        )  # fmt: skip
    return rows


def measure() -> list[Row]:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-delay-scale-") as tmp:
        rows = million(Path(tmp) / "single")
        rows += cluster_rows(Path(tmp))
    print(
        f"  load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the "
        f"end, {os.cpu_count()} cores",
        flush=True,
    )
    return rows


if __name__ == "__main__":
    from .table import render

    print(render(measure()))
