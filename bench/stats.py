"""Stats: cost of recording one task event, and no-op task throughput with every capability on.

* Recording: ``Recorder.count`` over 100 task names, median of many batches.
* Hooks: what the stats hooks add to one task's path in the worker's main
  process (the counting strategy wrapper, the request's counting class and its
  accepted and success callbacks), timed in-process with and without them.
* Throughput: two prefork workers (concurrency 2), plain Celery and
  celery-extras (every capability installed, no policy on the task), started
  once and warmed. In each of :data:`PAIRS` pairs of drains, a backlog of no-op
  tasks is queued for one worker while it does not consume, then drained while
  the other worker is paused (SIGSTOP), so each drain has the machine alone;
  the order alternates. The drain ends on the last task's result (the worker is
  not polled while it drains). The ratio is of the summed rates; the pairs'
  ratios show the spread.
* Instructions: the same no-op tasks drained by a worker whose main process runs
  under ``valgrind --tool=callgrind``, instrumented only while it drains. Unlike
  rates, instruction counts repeat whatever else the VM does, so they resolve
  what a few per cent of throughput cannot here: with the main process the
  limit, the throughput lost is the share of instructions added. Under valgrind
  the worker runs about 50 times slower, so its time-driven work (heartbeats,
  stats events, sync timers) falls on far fewer tasks than in real time; it is
  counted while the worker idles, and its rate times the drain's length is
  taken off, leaving the work per task.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
import timeit
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from celery import Celery
from celery.result import AsyncResult
from celery.worker.request import Request

from celery_extras.admission.request_hook import RequestHook
from celery_extras.stats.outcomes import OutcomeCounter, counting_strategy
from celery_extras.stats.recorder import RECEIVED, Recorder
from tests.support import proj
from tests.support.brokers import BROKERS, require_broker
from tests.support.workers import WorkerProcess, wait_for

from .table import Row

__all__ = ["measure"]

#: a task module with no policy: the app parks nothing, so no due queue or mover is measured
TASK = "bench.noop"
INCLUDE = ("bench.noop_tasks",)
#: Alternating pairs of drains: one drain's rate varies by 15 % on a 2-core VM.
PAIRS = 40
#: Tasks per drain, a few seconds' work on each broker.
BACKLOG = {"redis": 1500, "rabbitmq": 3000}
WARM_UP = 200
#: Tasks drained under callgrind, and seconds it counts the idle worker's background.
COUNTED = 1000
IDLE_SECONDS = 5.0


def record_cost_us(names: int = 100, batches: int = 300, per_batch: int = 1000) -> float:
    """Median cost of one ``Recorder.count`` call, in microseconds."""
    recorder = Recorder()
    task_names = [f"bench.task.{i}" for i in range(names)]
    for name in task_names:
        recorder.count(name, RECEIVED)
    count = recorder.count
    calls = [task_names[i % names] for i in range(per_batch)]
    samples = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for name in calls:
            count(name, RECEIVED)
        samples.append((time.perf_counter_ns() - start) / per_batch / 1000)
    return statistics.median(samples)


class _Request(Request):
    """A request with no-op callbacks: only the hooks around them are timed."""

    def __init__(self) -> None:  # no message: nothing of Celery's own request is timed
        pass

    name = "bench.noop"

    def on_accepted(self, pid: Any, time_accepted: Any) -> None:
        pass

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> None:
        pass

    def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> None:
        pass


def hook_cost_us(number: int = 200_000, repeat: int = 5) -> tuple[float, float]:
    """One task's main-process path through the stats hooks: (without, with) them, in us.

    The path: the message handed to the task's strategy, the request handed to the
    pool (``on_task_request``), then the pool's accepted and success callbacks.
    """
    message = SimpleNamespace(headers={"task": _Request.name})

    def strategy(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any) -> None:
        pass

    def on_task_request(request: Any) -> None:
        pass

    def path(strategy: Callable[..., None], on_task_request: Callable[[Any], None]) -> float:
        def one_task() -> None:
            strategy(message, None, None, None, None)
            request = _Request()
            on_task_request(request)
            request.on_accepted(1, 0.0)
            request.on_success((False, None, 0.001))

        return min(timeit.repeat(one_task, number=number, repeat=repeat)) / number * 1e6

    without = path(strategy, on_task_request)
    recorder = Recorder()
    hook = RequestHook()
    hook.listen(outcomes=OutcomeCounter(recorder))
    consumer = SimpleNamespace(on_task_request=on_task_request)
    hook.wrap(consumer)
    with_hooks = path(
        counting_strategy(_Request.name, strategy, recorder), consumer.on_task_request
    )
    return without, with_hooks


def _total(app: Celery, worker: WorkerProcess) -> int:
    """Tasks the worker ran, every task counted (``inspect stats``' ``total``)."""
    stats = app.control.inspect(destination=[worker.hostname], timeout=2).stats()
    if not stats or worker.hostname not in stats:
        return -1
    return sum(int(n) for n in stats[worker.hostname].get("total", {}).values())


@dataclass
class Drainer:
    """One warmed worker that drains a backlog queued while it did not consume (of
    :data:`TASK`, or of the *task* a drain names, among the tasks of *include*)."""

    broker: str
    plain: bool
    logdir: Path
    include: tuple[str, ...] = INCLUDE
    conf: dict[str, Any] = field(default_factory=dict)
    ns: str = field(default_factory=lambda: f"b{uuid.uuid4().hex[:10]}")
    done: int = 0
    warmed: int = 0
    seconds: float = 0.0
    rates: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        conf = {"worker_prefetch_multiplier": 16, **self.conf}
        self.app = proj.make_app(self.broker, self.ns, conf, self.include, plain=self.plain)
        env = proj.worker_env(self.broker, self.ns, conf, self.include, plain=self.plain)
        name = "plain" if self.plain else "extras"
        self.worker = WorkerProcess(name, env, self.logdir / f"{self.ns}.log", concurrency=2)

    def start(self, timeout: float = 60.0, warm: tuple[str, ...] = (TASK,)) -> None:
        """Start the worker and warm it with each task of *warm* (the pool's processes,
        both sides' connections, each gate's scripts and buckets)."""
        self.worker.start(timeout=timeout)
        each = WARM_UP // len(warm)
        for task in warm:
            for i in range(each):
                self.app.send_task(task, args=(i,), ignore_result=True)
        self.warmed = each * len(warm)
        wait_for(lambda: _total(self.app, self.worker) >= self.warmed, timeout=timeout,
                 what="warm-up")  # fmt: skip

    def _consume(self, on: bool) -> None:
        command = self.app.control.add_consumer if on else self.app.control.cancel_consumer
        command(self.ns, destination=[self.worker.hostname], reply=True, timeout=5)

    def queue(self, tasks: int, task: str = TASK) -> AsyncResult:
        """Queue *tasks* of *task*, each with its own argument, while the worker does not
        consume; the last one's result."""
        for i in range(tasks - 1):
            self.app.send_task(task, args=(i,), ignore_result=True)
        return self.app.send_task(task, args=("last",))

    def drain(self, tasks: int, other: WorkerProcess, task: str = TASK) -> float:
        """Drain *tasks* of *task* queued while the worker was stopped (SIGSTOP), *other*
        paused: the seconds from the worker's SIGCONT to the last task's result.

        The worker consumes its queue throughout, as in production: a queue added at run
        time (``add_consumer``) is not timed, as Redis' transport starts its ``BRPOP`` on
        it only when the one in flight on the worker's other queues ends (a second at
        most; celery-extras' workers consume the delay store's due queue too)."""
        self.worker.pause()
        try:
            last = self.queue(tasks, task)
            other.pause()
            start = time.monotonic()
            self.worker.resume()
            last.get(timeout=300)
            elapsed = time.monotonic() - start
        finally:
            self.worker.resume()
            other.resume()
        self.done += tasks
        self.seconds += elapsed
        self.rates.append(tasks / elapsed)
        return elapsed

    def check(self) -> None:
        """Every task queued ran (the drains ended on the last one's result)."""
        want = self.warmed + self.done
        wait_for(lambda: _total(self.app, self.worker) >= want, timeout=60, interval=0.2,
                 what=f"{want} tasks done by {self.worker.name}")  # fmt: skip

    @property
    def rate(self) -> float:
        return self.done / self.seconds

    def stop(self) -> None:
        self.worker.stop()
        self.app.close()


D = TypeVar("D", bound=Drainer)


def alternate(plain: D, extras: D, pairs: int, tasks: int) -> tuple[D, D]:
    """*plain* and *extras* started, each draining *tasks* in *pairs* pairs of drains (who
    goes first alternates, the other's worker idle meanwhile), checked and stopped."""
    try:
        plain.start()
        extras.start()
        for pair in range(pairs):
            order = (plain, extras) if pair % 2 == 0 else (extras, plain)
            for side, other in (order, order[::-1]):
                side.drain(tasks, other.worker)
        plain.check()
        extras.check()
    finally:
        plain.stop()
        extras.stop()
    return plain, extras


def throughput(broker_name: str, logdir: Path) -> tuple[Drainer, Drainer]:
    """Plain and extras drainers after :data:`PAIRS` alternating pairs of drains."""
    broker = require_broker(broker_name)
    return alternate(Drainer(broker, True, logdir), Drainer(broker, False, logdir), PAIRS,
                     BACKLOG[broker_name])  # fmt: skip


class CountedDrainer(Drainer):
    """A drainer whose worker runs under callgrind, instrumented only while measured."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.out = self.logdir / f"{self.ns}.callgrind"
        self.worker.argv = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={self.out}.%p", *self.worker.argv,
        ]  # fmt: skip

    @staticmethod
    def available() -> bool:
        return all(shutil.which(tool) for tool in ("valgrind", "callgrind_control"))

    def _callgrind(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.worker.pid)], check=True,
                       capture_output=True, timeout=120)  # fmt: skip

    def _instructions(self, suffix: str) -> int:
        for line in Path(f"{self.out}.{self.worker.pid}{suffix}").read_text().splitlines():
            if line.startswith("totals:"):
                return int(line.split()[1])
        raise ValueError(f"callgrind wrote no totals for {self.worker.name}")

    def instructions_per_task(self, tasks: int) -> float:
        """The main process's instructions per task of one drain, less its idle rate's share."""
        self.start(timeout=600)
        try:
            self._consume(False)  # its backlog is queued while it does not consume
            self._callgrind("-z")
            self._callgrind("-i", "on")
            start = time.monotonic()
            time.sleep(IDLE_SECONDS)
            self._callgrind("-i", "off")
            idle_seconds = time.monotonic() - start
            self._callgrind("-d", "idle")  # written to <out>.<pid>.1; the counts start again
            last = self.queue(tasks)
            self._callgrind("-i", "on")
            start = time.monotonic()
            self._consume(True)
            last.get(timeout=1800)
            self._callgrind("-i", "off")
            elapsed = time.monotonic() - start
            self._callgrind("-d", "drain")  # <out>.<pid>.2
            idle_rate = self._instructions(".1") / idle_seconds
            return (self._instructions(".2") - idle_rate * elapsed) / tasks
        finally:
            self.stop()


def pair_ratios(plain: list[float], extras: list[float]) -> str:
    """The ratio of each alternating pair of drains (*plain*'s and *extras*' rates, next
    to each other in time), as their median and quartiles: how far one drain moves the
    next on this VM."""
    ratios = [e / p for p, e in zip(plain, extras, strict=True)]
    if len(ratios) < 2:
        return f"pairs' ratio: {ratios[0]:.2f}"
    q1, q2, q3 = statistics.quantiles(ratios, n=4)
    return f"pairs' ratios: median {q2:.2f}, quartiles {q1:.2f}-{q3:.2f}"


def measure() -> list[Row]:
    rows = []
    cost = record_cost_us()
    rows.append(
        Row("stats: record one task event (100 names)", "us", None, cost, "<= 1.5 us",
            cost <= 1.5, runs=300)
    )  # fmt: skip
    without, with_hooks = hook_cost_us()
    rows.append(
        Row("stats: hooks in one task's main-process path (in-process, no I/O)", "us",
            without, with_hooks, "-", True, runs=5)
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-stats-") as tmp:
        for name in BROKERS:
            plain, extras = throughput(name, Path(tmp))
            rows.append(
                Row(f"stats: no-op tasks drained, prefork c=2, {name}", "tasks/s", plain.rate,
                    extras.rate, ">= 0.97x plain", extras.rate >= 0.97 * plain.rate,
                    runs=PAIRS, note=pair_ratios(plain.rates, extras.rates))
            )  # fmt: skip
            rows.extend(_instruction_rows(name, Path(tmp)))
    return rows


def _instruction_rows(broker_name: str, logdir: Path) -> list[Row]:
    """Main-process instructions per no-op task under callgrind: plain and extras."""
    if not CountedDrainer.available():
        print("stats: valgrind is not installed; no instruction rows")
        return []
    broker = require_broker(broker_name)
    plain = CountedDrainer(broker, True, logdir).instructions_per_task(COUNTED)
    extras = CountedDrainer(broker, False, logdir).instructions_per_task(COUNTED)
    return [
        Row(f"stats: instructions per no-op task, worker main process (callgrind), "
            f"{broker_name}", "instr", plain, extras, "<= 1.03x plain",
            extras <= 1.03 * plain, runs=1,
            note=f"{COUNTED} tasks; the idle worker's background taken off"),
    ]  # fmt: skip
