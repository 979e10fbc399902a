"""Sync: worker start-to-ready time against Celery's Mingle, and the cost of loading revokes.

* Start to ready, on Redis, one neighbour already running: plain Celery with
  Mingle (it waits ~1 s for neighbours' replies), plain Celery
  ``--without-mingle``, and celery-extras (store loaded before consuming,
  neighbours asked off the start path). Median over a few starts each.
* Loading 50,000 revoked ids from the store into a starting worker (the
  worker's own measure of its load: one script call, validation, merge).
* Convergence of a running worker after a revoke written only to the store
  (a broadcast it missed), with ``extras_sync_interval = 1``.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery

from celery_extras.store.client import redis_client, store_key
from celery_extras.sync import RevokeStore, record_revokes
from tests.support import proj
from tests.support.brokers import require_broker
from tests.support.workers import WorkerProcess

from .table import Row

__all__ = ["measure"]

STARTS = 5
IDS = 50_000
INTERVAL = 1.0


def _worker(
    logdir: Path, ns: str, name: str, plain: bool, conf: dict[str, Any], args: tuple[str, ...] = ()
) -> WorkerProcess:
    env = proj.worker_env(require_broker("redis"), ns, conf, (), plain)
    return WorkerProcess(name, env, logdir / f"{ns}-{name}.log", concurrency=1, args=args)


def _start_to_ready(worker: WorkerProcess) -> float:
    """Seconds from spawning the process to its ``ready.`` log line (polled every 5 ms)."""
    before = worker.ready_count()
    started = time.monotonic()
    worker.start(wait=False)
    while worker.ready_count() <= before:
        if not worker.alive():
            raise RuntimeError(f"worker {worker.name} exited:\n{worker.log()[-2000:]}")
        if time.monotonic() - started > 60:
            raise RuntimeError(f"worker {worker.name} not ready after 60 s")
        time.sleep(0.005)
    return time.monotonic() - started


def _ready_times(logdir: Path, plain: bool, args: tuple[str, ...] = ()) -> list[float]:
    """Start-to-ready of a worker, *STARTS* times, with one neighbour of the same kind up."""
    ns = f"bsync{uuid.uuid4().hex[:8]}"
    neighbour = _worker(logdir, ns, "neighbour", plain, {}).start()
    times = []
    try:
        for _ in range(STARTS):
            worker = _worker(logdir, ns, "starter", plain, {}, args)
            try:
                times.append(_start_to_ready(worker))
            finally:
                worker.stop()
    finally:
        neighbour.stop()
    return times


def _revoked_info(app: Celery, worker: WorkerProcess) -> dict[str, Any]:
    for reply in app.control.broadcast(
        "extras_revoked", arguments={"limit": 0}, destination=[worker.hostname],
        reply=True, timeout=2.0, limit=1,
    ) or []:  # fmt: skip
        if worker.hostname in reply:
            info: dict[str, Any] = reply[worker.hostname]["sync"]
            return info
    return {}


def _load_seconds(logdir: Path) -> tuple[float, int]:
    """A starting worker's own timing of loading *IDS* revoked ids from the store."""
    ns = f"bsync{uuid.uuid4().hex[:8]}"
    app = proj.make_app(require_broker("redis"), ns, {})
    store = RevokeStore(redis_client(app), store_key(app), IDS)
    expires = time.time() + 3600
    store.add({str(uuid.uuid4()): expires for _ in range(IDS)})
    worker = _worker(logdir, ns, "loader", False, {})
    try:
        worker.start()
        info = _revoked_info(app, worker)
        return float(info["load_seconds"]), int(info["loaded"])
    finally:
        worker.stop()
        for keys in store.shard_keys:
            store.client.delete(*keys)
        app.close()


def _convergence(logdir: Path, runs: int = 10) -> list[float]:
    """Seconds from a store-only revoke to a running worker holding it."""
    ns = f"bsync{uuid.uuid4().hex[:8]}"
    conf = {"extras_sync_interval": INTERVAL}
    app = proj.make_app(require_broker("redis"), ns, conf)
    worker = _worker(logdir, ns, "converger", False, conf).start()
    times = []
    try:
        for _ in range(runs):
            time.sleep(random.uniform(0, INTERVAL))  # at a random phase of the worker's cycle
            task_id = str(uuid.uuid4())
            started = time.monotonic()
            record_revokes(app, [task_id])
            while True:
                held = app.control.broadcast(
                    "extras_revoked", arguments={"limit": 5}, destination=[worker.hostname],
                    reply=True, timeout=0.5, limit=1,
                )  # fmt: skip
                if any(task_id in r.get(worker.hostname, {}).get("ids", []) for r in held):
                    break
                if time.monotonic() - started > 30:
                    raise RuntimeError("no convergence after 30 s")
            times.append(time.monotonic() - started)
    finally:
        worker.stop()
        app.close()
    return times


def measure() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        logdir = Path(tmp)
        mingle = statistics.median(_ready_times(logdir, plain=True))
        without = statistics.median(_ready_times(logdir, plain=True, args=("--without-mingle",)))
        extras = statistics.median(_ready_times(logdir, plain=False))
        load, loaded = _load_seconds(logdir)
        converge = max(_convergence(logdir))
    return [
        Row("start to ready, one neighbour (plain: Mingle)", "s", mingle, extras,
            ">= 0.8 s faster", mingle - extras >= 0.8, STARTS),
        Row("start to ready (plain: --without-mingle)", "s", without, extras,
            "within 0.2 s", extras - without <= 0.2, STARTS),
        Row(f"load {loaded:,} revoked ids at start", "s", None, load, "< 0.5 s", load < 0.5,
            note="worker's own timing"),
        Row("converge after a missed broadcast (max of 10)", "s", None, converge,
            f"<= 2 intervals ({2 * INTERVAL:g} s)", converge <= 2 * INTERVAL, 10),
    ]  # fmt: skip
