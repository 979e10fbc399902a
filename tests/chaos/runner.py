"""One seed's run against real workers and brokers: a private Redis as the store (behind a
proxy that can stall), the broker (a private persistent Redis, or a private RabbitMQ node) and
a private Redis for results, which no fault touches (a result lost with its backend is
Celery's); the journal on the shared Redis, outside the system under test. Producers send
the workload on time, a fault thread injects its faults, a pinger asks every worker for
``ping`` each second; then the run drains and its history is read. Every process started
here is stopped, even on failure."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from celery import Celery, chain, chord, group

from tests.chaos.checker import READY, History, Window
from tests.chaos.workload import Send, Workload
from tests.support import proj
from tests.support.brokers import PrivateRabbitMQ, PrivateRedis
from tests.support.journal import Journal
from tests.support.proxy import StallingProxy
from tests.support.workers import WorkerProcess

__all__ = ["run"]

INCLUDE = ("tests.chaos.tasks",)
CONCURRENCY = {"prefork": 2, "threads": 4, "gevent": 4, "eventlet": 4}
#: Seconds the run may take to drain after its last send and fault, and the longest it
#: waits with no new result (beyond the broker's visibility timeout, 30 s)
DRAIN, STALL = 150.0, 40.0
#: A live worker that answered none of this many last pings gets its stacks dumped
SILENT_PINGS = 5


class Run:
    """The processes of one run, and what it records."""

    def __init__(self, workload: Workload, broker: str, workdir: Path,
                 say: Callable[[str], None]) -> None:  # fmt: skip
        self.workload, self.kind, self.workdir, self.say = workload, broker, workdir, say
        self.ns = f"c{uuid.uuid4().hex[:10]}"
        self.journal = Journal(self.ns)
        self.windows: list[Window] = []
        self.pings: list[tuple[float, str, bool]] = []
        self.sent: dict[str, float] = {}
        self.unsent: set[str] = set()  # the messages of sends that raised (broker down)
        self.workers: list[WorkerProcess] = []
        self.errors: list[str] = []
        self._stop = threading.Event()

    @contextmanager
    def servers(self) -> Iterator[None]:
        (self.workdir / "store").mkdir(parents=True, exist_ok=True)
        (self.workdir / "broker").mkdir(parents=True, exist_ok=True)
        (self.workdir / "results").mkdir(parents=True, exist_ok=True)
        self.store = PrivateRedis(self.workdir / "store").start()
        self.redis = PrivateRedis(self.workdir / "broker").start()  # a Redis broker
        self.backend = PrivateRedis(self.workdir / "results").start()  # never faulted
        self.backend_client = redis.Redis(port=self.backend.port, decode_responses=True)
        self.proxy = StallingProxy(("127.0.0.1", self.store.port)).start()
        self.rabbitmq = PrivateRabbitMQ().launch() if self.kind == "rabbitmq" else None
        try:
            yield
        finally:
            self.proxy.close()
            self.store.stop()
            self.redis.stop()
            self.backend_client.close()
            self.backend.stop()
            if self.rabbitmq is not None:
                self.rabbitmq.shutdown()

    def configure(self) -> Celery:
        self.broker_url = (self.rabbitmq or self.redis).url
        self.conf = {
            "result_backend": f"redis://127.0.0.1:{self.backend.port}/0",
            "extras_redis_url": self.proxy.url,
            "extras_eta_store": True,
            "extras_eta_threshold": 1.0,
            "task_acks_late": True,
            # a dead worker's unacked messages come back 30 s after their delivery; kombu's
            # restore mutex, held by a worker SIGKILLed as it restores, expires in 10 s, not
            # 300 (tests/integration/conftest.py: MUTEX_EXPIRE)
            "broker_transport_options": {
                "visibility_timeout": 30,
                "unacked_restore_interval": 1,
                "unacked_restore_throttle": 1,
                "unacked_mutex_expire": 10,
            },
        }
        self.app = proj.make_app(self.broker_url, self.ns, self.conf, INCLUDE)
        return self.app

    def start_worker(self, index: int) -> WorkerProcess:
        env = proj.worker_env(self.broker_url, self.ns, self.conf, INCLUDE)
        pool = self.workload.pool
        name = f"w{index}"
        worker = WorkerProcess(name, env, self.workdir / f"{name}.log",
                               concurrency=CONCURRENCY[pool], pool=pool)  # fmt: skip
        if index < len(self.workers):
            self.workers[index] = worker
        else:
            self.workers.append(worker)
        return worker.start(wait=False)

    # -- the run ---------------------------------------------------------------------------

    def produce(self, producer: int, t0: float) -> None:
        for send in self.workload.sends:
            if send.producer != producer:
                continue
            if self._stop.wait(max(t0 + send.at - time.time(), 0.0)):
                return
            try:
                self._send(send)
            except Exception as exc:  # a broker down: the producer's own retry gave up
                self.errors.append(f"send at {send.at}: {exc!r}")
                self.unsent.update(node.id for node in send.nodes)

    def _send(self, send: Send) -> None:
        sigs = [self.app.signature(n.task, args=(n.key, n.tag, n.seconds),
                                   options={"task_id": n.id}) for n in send.nodes]  # fmt: skip
        now = time.time()
        for node in send.nodes:
            self.sent[node.id] = now
        if send.shape in ("one", "countdown"):
            sigs[0].apply_async(countdown=send.countdown or None)
        elif send.shape == "chain":
            chain(*[s.set(immutable=True) for s in sigs]).apply_async()
        elif send.shape == "group":
            group(sigs).apply_async()
        elif send.shape == "chord":
            chord(sigs[:-1])(sigs[-1].set(immutable=True))
        else:  # link
            sigs[0].apply_async(link=sigs[1].set(immutable=True))

    def inject(self, t0: float) -> None:
        for fault in self.workload.faults:
            if self._stop.wait(max(t0 + fault.at - time.time(), 0.0)):
                return
            target = self.workers[fault.target % len(self.workers)]
            start = time.time()
            self.say(
                f"  {start - t0:5.1f} s: {fault.kind} ({fault.length:.1f} s)"
                + (f" of {target.hostname}" if fault.kind in ("kill", "term") else "")
            )
            try:
                self._fault(fault.kind, fault.length, target)
            except Exception as exc:
                self.errors.append(f"fault {fault.kind} at {fault.at}: {exc!r}")
            worker = target.hostname if fault.kind in ("kill", "term") else ""
            end = start if fault.kind == "kill" else time.time()
            self.windows.append(Window(fault.kind, start, end, worker))
            if fault.kind == "kill":  # restarted after its length, as a supervisor would
                time.sleep(fault.length)
                self.windows.append(Window("join", time.time(), time.time(), target.hostname))
                self.start_worker(self.workers.index(target))

    def _fault(self, kind: str, length: float, target: WorkerProcess) -> None:
        if kind == "kill":
            target.kill()
        elif kind == "term":
            target.stop(timeout=30.0)
            time.sleep(length)
            self.start_worker(self.workers.index(target))
        elif kind == "store_stall":
            self.proxy.stall()
            time.sleep(length)
            self.proxy.resume()
        elif kind == "store_pause":
            assert self.store.proc is not None
            os.kill(self.store.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(length)
            finally:
                os.kill(self.store.proc.pid, signal.SIGCONT)
        elif kind == "store_restart":
            self.store.restart(down_for=length)
        elif kind == "broker_restart":
            (self.rabbitmq or self.redis).restart(down_for=length)
        elif kind == "join":
            self.start_worker(len(self.workers))

    def ping(self) -> None:
        while not self._stop.wait(1.0):
            names = [w.hostname for w in self.workers if w.alive() and w.ready_count()]
            if not names:
                continue
            t = time.time()
            try:
                replies = self.app.control.ping(destination=names, timeout=2.0)
            except Exception:
                replies = []
            answered = {name for reply in replies for name in reply}
            self.pings += [(t, name, name in answered) for name in names]

    def dump_silent(self) -> None:
        """The threads' stacks (``py-spy dump``) of every live worker that answered none of
        its last :data:`SILENT_PINGS` pings, into ``<worker>.stack``: a frozen worker's
        post-mortem (a threads worker stopped after a RabbitMQ and a store restart once,
        seed 578629, and its replay did not stop)."""
        spy = Path(sys.executable).with_name("py-spy")
        for worker in self.workers:
            last = [ok for _, name, ok in self.pings if name == worker.hostname][-SILENT_PINGS:]
            if len(last) < SILENT_PINGS or any(last) or not worker.alive() or not spy.exists():
                continue
            dump = subprocess.run([str(spy), "dump", "--pid", str(worker.pid)],
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
            path = self.workdir / f"{worker.name}.stack"
            path.write_text(dump.stdout + dump.stderr)
            self.say(f"  {worker.hostname} answered none of its last {SILENT_PINGS} pings: "
                     f"its threads' stacks are in {path}")  # fmt: skip

    def keep_stats(self) -> None:
        """Every worker's ``inspect stats`` once the run drained (its prefetch window and
        what each gate holds), into ``stats.json``: where messages that never ended wait."""
        try:
            stats = self.app.control.inspect(timeout=5.0).stats() or {}
        except Exception as exc:
            stats = {"error": repr(exc)}
        (self.workdir / "stats.json").write_text(json.dumps(stats, default=repr, indent=1))

    # -- the history -----------------------------------------------------------------------

    def results(self) -> dict[str, tuple[str, Any]]:
        client = self.backend_client  # read every half second while the run drains
        ids = [n.id for n in self.workload.nodes()]
        found: dict[str, tuple[str, Any]] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            for task_id, raw in zip(chunk, client.mget([f"celery-task-meta-{i}" for i in chunk]),
                                    strict=True):  # fmt: skip
                if raw is not None:
                    meta = json.loads(raw)
                    found[task_id] = (meta.get("status"), meta.get("result"))
        return found

    def drain(self) -> dict[str, tuple[str, Any]]:
        """The results, once every message has one, none came for :data:`STALL` s (what
        is missing then is lost: a SIGKILLed worker's messages are back within the
        visibility timeout), or the drain's time is up."""
        deadline = time.time() + DRAIN
        wanted = len(self.workload.nodes())
        ready, moved = -1, time.time()
        while True:
            found = self.results()
            now_ready = sum(1 for state, _ in found.values() if state in READY)
            if now_ready != ready:
                ready, moved = now_ready, time.time()
            if ready >= wanted or time.time() > min(deadline, moved + STALL):
                time.sleep(1.0)  # a late second body shows up in this period
                return self.results()
            time.sleep(0.5)


def run(workload: Workload, broker: str, workdir: Path,
        say: Callable[[str], None] = print) -> History:  # fmt: skip
    """Run *workload* on *broker* (``"redis"`` or ``"rabbitmq"``) and return its history."""
    from tests.chaos.tasks import CAPS, RATES

    one = Run(workload, broker, workdir, say)
    say(f"chaos {workload.describe()}, {broker}")
    with one.servers():
        one.configure()
        try:
            for index in range(workload.workers):
                one.start_worker(index)
            for worker in one.workers:
                worker.wait_ready(60)
            t0 = time.time()
            threads = [threading.Thread(target=one.produce, args=(p, t0), daemon=True)
                       for p in range(2)]  # fmt: skip
            threads += [threading.Thread(target=one.inject, args=(t0,), daemon=True),
                        threading.Thread(target=one.ping, daemon=True)]  # fmt: skip
            for thread in threads:
                thread.start()
            for thread in threads[:-1]:
                thread.join()
            one.dump_silent()
            results = one.drain()
            one.keep_stats()
            one._stop.set()
            threads[-1].join(5)
            entries = one.journal.entries()
            in_transit = set(one.redis.lost_in_transit()) if broker == "redis" else set()
        finally:
            one._stop.set()
            for worker in one.workers:
                with contextlib.suppress(Exception):
                    worker.stop(timeout=0)
            gc.collect()  # the sends' results unsubscribe while the result store is up
            one.app.close()
            one.journal.clear()
    for error in one.errors:
        say(f"  producer or fault error: {error}")
    kept = {"sent": one.sent, "unsent": sorted(one.unsent), "entries": entries,
            "results": results, "windows": [vars(w) for w in one.windows],
            "in_transit": sorted(in_transit), "pings": one.pings}  # fmt: skip
    (workdir / "history.json").write_text(json.dumps(kept, default=repr))  # for a post-mortem
    return History(workload, dict(one.sent), entries, results, one.windows, one.pings,
                   rates=RATES, caps=CAPS, broker=broker, in_transit=in_transit,
                   unsent=one.unsent)  # fmt: skip
