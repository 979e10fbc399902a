"""``python -m bench batch``: a batched no-op against the same task unbatched.

One worker (prefork, concurrency 2, Redis broker and result backend) drains a backlog
queued before it starts; the figure is messages per second from the worker's start to the
last caller's result stored. Plain Celery runs ``bench.batch.noop`` unbatched; celery-extras
runs ``bench.batch.batched``, the same no-op under ``batch(size=100, wait=0.5)``, which
returns one result per call. Both store a result per message: every caller is answered.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from celery import shared_task

from celery_extras import Call, batch
from tests.support import proj
from tests.support.brokers import BACKEND_URL, REDIS_URL, require_broker
from tests.support.workers import WorkerProcess, wait_for

from .table import Row

__all__ = ["all_stored", "clean_up", "measure"]

INCLUDE = ("bench.batch",)
BACKLOG = 5000
SIZE = 100


@shared_task(name="bench.batch.noop")
def noop(x: Any = None) -> Any:
    return x


@batch(size=SIZE, wait=0.5)
@shared_task(name="bench.batch.batched")
def batched(calls: list[Call]) -> list[Any]:
    return [call.args[0] for call in calls]


def all_stored(results: redis.Redis, keys: list[str]) -> bool:
    """Whether the result backend holds every one of result *keys*."""
    return sum(results.exists(*keys[i : i + 1000])
               for i in range(0, len(keys), 1000)) == len(keys)  # fmt: skip


def clean_up(client: redis.Redis, results: redis.Redis, ns: str, keys: list[str]) -> None:
    """Delete namespace *ns*'s broker keys and the result *keys*; close both clients."""
    for key in client.scan_iter(f"*{ns}*", count=1000):
        client.delete(key)
    for i in range(0, len(keys), 1000):
        results.delete(*keys[i : i + 1000])
    client.close()
    results.close()


def _drain(task: str, plain: bool, backlog: int) -> float:
    """Messages per second one worker drains *backlog* of *task* at, results stored."""
    ns = f"b{uuid.uuid4().hex[:10]}"
    broker = require_broker("redis")
    app = proj.make_app(broker, ns, {}, INCLUDE, plain=plain)
    client, results = redis.Redis.from_url(REDIS_URL), redis.Redis.from_url(BACKEND_URL)
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        worker = WorkerProcess("w1", proj.worker_env(broker, ns, {}, INCLUDE, plain),
                               Path(tmp) / "w1.log", concurrency=2)  # fmt: skip
        keys: list[str] = []
        try:
            ids = [app.send_task(task, args=(i,)).id for i in range(backlog)]
            keys = [f"celery-task-meta-{i}" for i in ids]
            worker.start(wait=False)
            worker.wait_ready()
            started = time.monotonic()
            wait_for(lambda: all_stored(results, keys), timeout=600, interval=0.05,
                     what=f"{backlog} results of {task}")  # fmt: skip
            return backlog / (time.monotonic() - started)
        finally:
            worker.stop()
            app.close()
            clean_up(client, results, ns, keys)


def measure(backlog: int = BACKLOG) -> list[Row]:
    """Plain Celery's unbatched drain rate beside celery-extras' batched one (best of 2)."""
    plain = max(_drain("bench.batch.noop", True, backlog) for _ in range(2))
    extras = max(_drain("bench.batch.batched", False, backlog) for _ in range(2))
    name = (
        f"batch: a no-op drained, {backlog} queued, prefork c=2, redis (unbatched plain "
        f"Celery vs batch(size={SIZE}, wait=0.5), a result per message)"
    )
    return [Row(name, "msgs/s", round(plain), round(extras), ">= 1x plain", extras >= plain, 2)]
