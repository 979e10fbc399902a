"""One bench worker in a namespace of its own: started, its main process's RSS sampled, and
everything (worker, pool, queues, store keys, journal) stopped and deleted on exit, even when
the bench fails half-way.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from tests.support import proj
from tests.support.brokers import REDIS_URL, require_broker
from tests.support.journal import Journal
from tests.support.workers import WorkerProcess

__all__ = [
    "Cluster",
    "RssSampler",
    "Run",
    "cpu_seconds",
    "machine_cpu_seconds",
    "rss_kb",
    "send_each",
]

_TICK = os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int) -> int:
    """Resident set size of process *pid* in kB (0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process *pid* has used so far, in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_cpu_seconds() -> float:
    """CPU time every core of the machine has spent busy so far (``/proc/stat``: all but
    idle and iowait), in seconds: every process, exited ones and the kernel's own work too."""
    with open("/proc/stat") as stat:
        fields = [int(one) for one in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK


def send_each(app: Celery, name: str, args: Iterable[tuple[Any, ...]], **options: Any) -> int:
    """Publish one *name* task of *app* per ``args`` tuple on one pooled producer; how many."""
    count = 0
    with app.producer_or_acquire() as producer:
        for one in args:
            app.send_task(name, args=one, producer=producer, **options)
            count += 1
    return count


class RssSampler(threading.Thread):
    """Samples a process's RSS every *interval* s: ``samples`` is ``[(epoch s, kB), ...]``."""

    def __init__(self, pid: int, interval: float = 2.0) -> None:
        super().__init__(name=f"rss-{pid}", daemon=True)
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while True:
            kb = rss_kb(self.pid)
            if kb:
                self.samples.append((time.time(), kb))
            if self._stop_event.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(5)

    def peak_kb(self, since: float = 0.0, until: float = float("inf")) -> int:
        """Highest sample taken in ``[since, until]`` (epoch seconds)."""
        return max((kb for t, kb in self.samples if since <= t <= until), default=0)


class Run:
    """One worker (prefork, concurrency 2) on Redis, plain Celery or celery-extras with *conf*.

    Use as a context manager: on exit the worker and its pool are stopped (SIGTERM, then
    SIGKILL) and every key of the run's namespace is deleted (queue, unacked messages, due
    queue, delay store, buckets, journal), so a 100k backlog does not outlive its run.
    """

    def __init__(
        self, conf: dict[str, Any], plain: bool, include: tuple[str, ...], interval: float = 2.0
    ) -> None:
        self.broker = require_broker("redis")
        self.ns = f"b{uuid.uuid4().hex[:10]}"
        self.conf = {"task_ignore_result": True, **conf}
        self.journal = Journal(self.ns)
        self.app = proj.make_app(self.broker, self.ns, self.conf, include, plain)
        env = proj.worker_env(self.broker, self.ns, self.conf, include, plain)
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-run-")
        self.worker = WorkerProcess("w1", env, Path(self.tmp.name) / "w1.log", concurrency=2)
        self.interval = interval
        self.sampler: RssSampler | None = None
        self.ready_at = 0.0

    def start(self) -> float:
        """Start the worker, wait until it consumes, start sampling; the time it was ready."""
        self.worker.start(wait=False)
        self.sampler = RssSampler(self.worker.pid, self.interval)
        self.sampler.start()
        self.worker.wait_ready(timeout=120)
        self.ready_at = time.time()
        return self.ready_at

    def idle_kb(self, settle: float = 5.0) -> int:
        """The idle worker's RSS: the highest sample over *settle* s with nothing queued."""
        assert self.sampler is not None, "worker not started"
        since = time.time()
        time.sleep(settle)  # a measurement period, not a wait for a condition
        return self.sampler.peak_kb(since) or rss_kb(self.worker.pid)

    def send(self, name: str, args: Iterable[tuple[Any, ...]], **options: Any) -> int:
        """Publish one *name* task per ``args`` tuple on one pooled producer; how many."""
        return send_each(self.app, name, args, **options)

    def starts(self, task: str) -> list[dict[str, Any]]:
        """The journal's runs of *task*, in start order."""
        return sorted((e for e in self.journal.entries() if e["task"] == task),
                      key=lambda e: e["t"])  # fmt: skip

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.sampler is not None:
                self.sampler.stop()
            self.worker.stop()
        finally:
            client = redis.Redis.from_url(REDIS_URL)
            try:
                for key in client.scan_iter(f"*{self.ns}*", count=1000):
                    client.delete(key)
            finally:
                client.close()
                self.app.close()
                self.tmp.cleanup()


class Cluster:
    """A namespace with its app (celery-extras with *conf*, or plain Celery, task modules
    *include*), journal and workers; on exit the workers are stopped and every key of the
    namespace deleted."""

    def __init__(
        self, include: tuple[str, ...], conf: dict[str, Any] | None = None, plain: bool = False
    ) -> None:
        self.broker = require_broker("redis")
        self.ns = f"b{uuid.uuid4().hex[:10]}"
        self.journal = Journal(self.ns)
        self.app = proj.make_app(self.broker, self.ns, conf or {}, include, plain)
        self.env = proj.worker_env(self.broker, self.ns, conf or {}, include, plain)
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-cluster-")
        self.workers: list[WorkerProcess] = []

    def start(self, name: str, concurrency: int = 2, queues: tuple[str, ...] = ()) -> WorkerProcess:
        worker = WorkerProcess(name, self.env, Path(self.tmp.name) / f"{name}.log",
                               concurrency=concurrency, queues=queues)  # fmt: skip
        self.workers.append(worker)
        return worker.start(wait=False)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        for worker in self.workers:
            worker.stop()
        self.journal.clear()
        self.app.control.purge()
        self.app.close()
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"*{self.ns}*", count=1000):
            client.delete(key)
        client.close()
        self.tmp.cleanup()
