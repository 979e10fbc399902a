"""``python -m bench green_restarts [--restarts N] [--pool gevent|eventlet]``: green-pool
workers that freeze after a RabbitMQ restart, plain Celery's and celery-extras' side by side.

The chaos checker found a gevent worker that answered no ``ping`` after a RabbitMQ restart
(seed 172743). Plain Celery's gevent workers freeze there more often: after a reconnect
Celery (5.5 on) narrows the prefetch window and widens it again from each task's ack, which
on a green pool runs in the task's own greenlet. Its ``basic.qos`` reads the connection for
the broker's answer, meets a new task there and hands it to the pool, whose every slot is
held by a task greenlet doing the same: the pool and the consumer wait on each other for
good (celery-extras turns the reduction off: ``PrefetchRestoreGuard``).

Two workers of each kind (``-c 4``) take ~20 tasks/s each side (celery-extras' under its
policies); the broker is stopped for 3 s, then every worker must answer ``ping`` within
45 s. A worker that does not is counted frozen, its greenlets' stacks are written beside
its log (:mod:`bench.green_app`), and it is killed and started again.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from celery import Celery

from tests.support import proj
from tests.support.brokers import PrivateRabbitMQ, private_rabbitmq
from tests.support.workers import WorkerProcess

from .table import Row

__all__ = ["measure"]

CONF = {"task_acks_late": True, "extras_eta_store": True, "extras_eta_threshold": 1.0}
#: each side's task modules and the tasks it sends in turn (``tests.sleep(seconds, tag)``,
#: the checker's ``chaos.*(key, tag, seconds)``)
SIDES = {
    "plain": (("tests.support.tasks",), ("tests.sleep",)),
    "extras": (("tests.support.tasks", "tests.chaos.tasks"),
               ("tests.sleep", "chaos.limited", "chaos.capped", "chaos.coalesced",
                "chaos.debounced")),
}  # fmt: skip
DOWN, ANSWER = 3.0, 45.0
#: What py-amqp logs when a closing channel gets the answer to another greenlet's request
RACE = "during closing channel"


class Side:
    """One kind of worker: its app (for sends and pings) and its two workers."""

    def __init__(self, name: str, url: str, pool: str, workdir: Path) -> None:
        self.name = name
        include, self.tasks = SIDES[name]
        ns = f"green{name}{uuid.uuid4().hex[:6]}"
        plain = name == "plain"
        conf = {**CONF, "result_backend": "redis://127.0.0.1:6379/0"}
        self.app: Celery = proj.make_app(url, ns, conf, include, plain=plain)
        env = {
            **proj.worker_env(url, ns, conf, include, plain=plain),
            "BENCH_GREEN_FOLDER": str(workdir),
        }
        self.workers = [WorkerProcess(f"{name}{i}", env, workdir / f"{name}{i}.log",
                                      app="bench.green_app", concurrency=4, pool=pool)
                        for i in range(2)]  # fmt: skip
        self.pool = pool
        self.frozen = 0

    def send(self, n: int) -> None:
        name = self.tasks[n % len(self.tasks)]
        args = (0.05, n) if name == "tests.sleep" else (f"k{n % 5}", n, 0.05)
        self.app.signature(name, args=args).apply_async(retry=False)

    def races(self) -> int:
        """How often a worker's close of its old event connection took the answer to a
        publish under way on it (py-amqp's warning)."""
        return sum(w.log().count(RACE) for w in self.workers)

    def silent(self) -> list[WorkerProcess]:
        """The workers that answered no ``ping`` within :data:`ANSWER` s."""
        waiting = {w.hostname: w for w in self.workers}
        deadline = time.monotonic() + ANSWER
        while waiting and time.monotonic() < deadline:
            try:
                replies = self.app.control.ping(destination=list(waiting), timeout=2.0)
            except Exception:  # the broker is still coming back
                replies = []
                time.sleep(1.0)
            for reply in replies:
                for name in reply:
                    waiting.pop(name, None)
        return list(waiting.values())


def _produce(sides: list[Side], stop: threading.Event) -> None:
    for n in itertools.count():
        if stop.wait(0.05):
            return
        for side in sides:
            try:
                side.send(n)
            except Exception:  # the broker is down: this send is skipped
                time.sleep(0.5)


def _cycle(rabbitmq: PrivateRabbitMQ, sides: list[Side], index: int) -> None:
    rabbitmq.restart(down_for=DOWN)
    for side in sides:
        for worker in side.silent():
            side.frozen += 1
            if side.pool == "gevent":
                os.kill(worker.pid, signal.SIGUSR2)  # bench.green_app writes its greenlets
                time.sleep(3.0)  # the dump's own time, not a wait for a condition
            print(f"  restart {index}: {worker.hostname} frozen ({worker.log_path})", flush=True)
            starts = worker.ready_count()
            worker.signal(signal.SIGKILL)
            worker.start(wait=False).wait_ready(120, count=starts + 1)


def measure(argv: Sequence[str] = ()) -> list[Row]:
    parser = argparse.ArgumentParser(prog="python -m bench green_restarts")
    parser.add_argument("--restarts", type=int, default=12)
    parser.add_argument("--pool", choices=("gevent", "eventlet"), default="gevent")
    options = parser.parse_args(list(argv))
    if options.restarts < 1:
        parser.error(f"--restarts must be 1 or more, not {options.restarts}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-green-restarts-"))
    stop = threading.Event()
    with private_rabbitmq() as rabbitmq:
        sides = [Side(name, rabbitmq.url, options.pool, workdir) for name in SIDES]
        workers = [w for side in sides for w in side.workers]
        try:
            for worker in workers:
                worker.start(wait=False)
            for worker in workers:
                worker.wait_ready(120)
            threading.Thread(target=_produce, args=(sides, stop), daemon=True).start()
            for index in range(options.restarts):
                time.sleep(random.uniform(5.0, 15.0))  # load between restarts
                _cycle(rabbitmq, sides, index)
        finally:
            stop.set()
            for worker in workers:
                worker.stop(timeout=0)
            for side in sides:
                side.app.close()
    plain, extras = (float(side.frozen) for side in sides)
    races = {side.name: side.races() for side in sides}
    total = 2 * options.restarts
    return [Row(f"{options.pool} workers frozen after a RabbitMQ restart (of {total})",
                "workers", plain, extras, "0", extras == 0, runs=options.restarts,
                note=f"2 workers -c 4 per side, ~20 tasks/s each; closes that dropped a "
                f"publish's answer {races}; logs in {workdir}")]  # fmt: skip
