"""Stats: cost of recording one task event, and no-op task throughput with every capability on.

* Recording: ``Recorder.count`` over 100 task names, median of many batches.
* Hooks: what the stats hooks add to one task's path in the worker's main
  process (the ``task_received`` receiver, the pool callbacks wrapped to count
  start, success and runtime), timed in-process with and without them.
* Throughput: two prefork workers (concurrency 2), plain Celery and
  celery-extras (every capability installed, no policy on the task), started
  once and warmed. In each of :data:`PAIRS` pairs of drains, a backlog of no-op
  tasks is queued for one worker while it does not consume, then drained while
  the other worker is paused (SIGSTOP), so each drain has the machine alone;
  the order alternates. The drain ends on the last task's result (the worker is
  not polled while it drains). The ratio is of the summed rates; the pairs'
  ratios show the spread.
* Instructions: during each drain ``perf stat`` counts the instructions retired
  by the worker's main process and by the whole machine. Unlike the rates, the
  main process's repeat within about 1 % from drain to drain (the whole
  machine's within a few per cent), so their medians resolve what a few per
  cent of throughput cannot on a shared VM: with the machine's CPU the limit,
  the throughput lost is the share of instructions added.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import timeit
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery, signals
from celery.worker.request import Request

from celery_extras.stats.recorder import RECEIVED, Recorder
from celery_extras.stats.recording import _Receivers, track_pool
from tests.support import proj
from tests.support.brokers import BROKERS, require_broker
from tests.support.workers import WorkerProcess, wait_for

from .table import Row

__all__ = ["measure"]

TASK = "tests.stats.succeeds"
INCLUDE = ("tests.support.tasks_stats",)
PAIRS = 10
#: Tasks per drain, a few seconds' work on each broker.
BACKLOG = {"redis": 1500, "rabbitmq": 3000}
WARM_UP = 200


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

    def on_accepted(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_success(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_failure(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Pool:
    """A pool that runs nothing and calls back at once, as the real one does later."""

    def apply_async(self, target: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        options["accept_callback"](os.getpid(), 0.0)
        options["callback"]((False, None, 0.001))


def hook_cost_us(number: int = 200_000, repeat: int = 5) -> tuple[float, float]:
    """One task's main-process path through the stats hooks: (without, with) them, in us."""
    app = Celery("bench-hooks", set_as_current=False)
    consumer = type("Consumer", (), {"app": app})()
    request, pool = _Request(), _Pool()

    def one_task() -> None:
        signals.task_received.send(sender=consumer, request=request)
        pool.apply_async(
            None, accept_callback=request.on_accepted, callback=request.on_success,
            error_callback=request.on_failure,
        )  # fmt: skip

    def best(fn: Callable[[], None]) -> float:
        return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6

    without = best(one_task)
    recorder = Recorder()
    receivers = _Receivers(app, recorder)
    receivers.connect()
    undo = track_pool(pool, recorder)
    try:
        with_hooks = best(one_task)
    finally:
        undo()
        receivers.disconnect()
    return without, with_hooks


class Instructions:
    """Instructions retired while the ``with`` block runs, counted by ``perf stat``: by
    process *pid*, or with ``None`` by the whole machine. ``count`` stays ``None`` when
    perf cannot count here."""

    def __init__(self, pid: int | None) -> None:
        self.target = ["-p", str(pid)] if pid is not None else ["-a"]
        self.count: int | None = None

    @staticmethod
    def available() -> bool:
        if shutil.which("perf") is None:
            return False
        probe = subprocess.run(["perf", "stat", "-x,", "-e", "instructions", "true"],
                               capture_output=True, text=True)  # fmt: skip
        return probe.returncode == 0 and "not supported" not in probe.stderr

    def __enter__(self) -> Instructions:
        fd, name = tempfile.mkstemp(prefix="perf-", suffix=".csv")
        os.close(fd)  # perf writes the file itself; only its name is needed
        self._out = Path(name)
        self._perf = subprocess.Popen(
            ["perf", "stat", "-x,", "-e", "instructions", *self.target, "-o", name],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.2)  # perf attaches before the work starts
        return self

    def __exit__(self, *exc: object) -> None:
        self._perf.send_signal(signal.SIGINT)
        self._perf.wait(30)
        lines = self._out.read_text().strip().splitlines()
        self._out.unlink()
        try:
            self.count = int(lines[-1].split(",")[0])
        except (IndexError, ValueError):  # "<not counted>" or no output
            self.count = None


def _total(app: Celery, worker: WorkerProcess) -> int:
    stats = app.control.inspect(destination=[worker.hostname], timeout=2).stats()
    if not stats or worker.hostname not in stats:
        return -1
    return int(stats[worker.hostname].get("total", {}).get(TASK, 0))


@dataclass
class Drainer:
    """One warmed worker that drains a backlog queued while it did not consume."""

    broker: str
    plain: bool
    logdir: Path
    ns: str = field(default_factory=lambda: f"b{uuid.uuid4().hex[:10]}")
    count_instructions: bool = False
    done: int = 0
    seconds: float = 0.0
    rates: list[float] = field(default_factory=list)
    #: Instructions per task of each drain: the worker's main process, the whole machine.
    main_instructions: list[float] = field(default_factory=list)
    machine_instructions: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        conf = {"worker_prefetch_multiplier": 16}
        self.app = proj.make_app(self.broker, self.ns, conf, INCLUDE, plain=self.plain)
        env = proj.worker_env(self.broker, self.ns, conf, INCLUDE, plain=self.plain)
        name = "plain" if self.plain else "extras"
        self.worker = WorkerProcess(name, env, self.logdir / f"{self.ns}.log", concurrency=2)

    def start(self) -> None:
        self.worker.start()
        for i in range(WARM_UP):  # the pool's processes and both sides' connections warm
            self.app.send_task(TASK, args=(i,), ignore_result=True)
        wait_for(lambda: _total(self.app, self.worker) >= WARM_UP, timeout=60, what="warm-up")
        self._consume(False)

    def _consume(self, on: bool) -> None:
        command = self.app.control.add_consumer if on else self.app.control.cancel_consumer
        command(self.ns, destination=[self.worker.hostname], reply=True, timeout=5)

    def drain(self, tasks: int, other: WorkerProcess) -> None:
        for i in range(tasks - 1):
            self.app.send_task(TASK, args=(i,), ignore_result=True)
        last = self.app.send_task(TASK, args=("last",))
        other.pause()
        try:
            with contextlib.ExitStack() as counting:
                main = machine = None
                if self.count_instructions:
                    main = counting.enter_context(Instructions(self.worker.pid))
                    machine = counting.enter_context(Instructions(None))
                start = time.monotonic()
                self._consume(True)
                last.get(timeout=300)
                elapsed = time.monotonic() - start
        finally:
            other.resume()
        self._consume(False)
        self.done += tasks
        self.seconds += elapsed
        self.rates.append(tasks / elapsed)
        if main is not None and main.count and machine is not None and machine.count:
            self.main_instructions.append(main.count / tasks)
            self.machine_instructions.append(machine.count / tasks)

    def check(self) -> None:
        """Every task queued ran (the drains ended on the last one's result)."""
        want = WARM_UP + self.done
        wait_for(lambda: _total(self.app, self.worker) >= want, timeout=60, interval=0.2,
                 what=f"{want} tasks done by {self.worker.name}")  # fmt: skip

    @property
    def rate(self) -> float:
        return self.done / self.seconds

    def stop(self) -> None:
        self.worker.stop()
        self.app.close()


def throughput(broker_name: str, logdir: Path) -> tuple[Drainer, Drainer]:
    """Plain and extras drainers after :data:`PAIRS` alternating pairs of drains."""
    broker = require_broker(broker_name)
    counting = Instructions.available()
    plain = Drainer(broker, True, logdir, count_instructions=counting)
    extras = Drainer(broker, False, logdir, count_instructions=counting)
    try:
        plain.start()
        extras.start()
        for pair in range(PAIRS):
            order = (plain, extras) if pair % 2 == 0 else (extras, plain)
            for side, other in (order, order[::-1]):
                side.drain(BACKLOG[broker_name], other.worker)
        plain.check()
        extras.check()
    finally:
        plain.stop()
        extras.stop()
    return plain, extras


def _quartiles(values: list[float]) -> str:
    q1, q2, q3 = statistics.quantiles(values, n=4)
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
            ratios = [e / p for p, e in zip(plain.rates, extras.rates, strict=True)]
            rows.append(
                Row(f"stats: no-op tasks drained, prefork c=2, {name}", "tasks/s", plain.rate,
                    extras.rate, ">= 0.97x plain", extras.rate >= 0.97 * plain.rate,
                    runs=PAIRS, note=_quartiles(ratios))
            )  # fmt: skip
            rows.extend(_instruction_rows(name, plain, extras))
    return rows


def _instruction_rows(broker: str, plain: Drainer, extras: Drainer) -> list[Row]:
    """Median instructions per task: the whole machine (the target) and the main process."""
    if not plain.machine_instructions or not extras.machine_instructions:
        print(f"stats: perf cannot count instructions here; no instruction rows for {broker}")
        return []
    machine = (
        statistics.median(plain.machine_instructions),
        statistics.median(extras.machine_instructions),
    )
    main = statistics.median(plain.main_instructions), statistics.median(extras.main_instructions)
    runs = min(len(plain.machine_instructions), len(extras.machine_instructions))
    return [
        Row(f"stats: instructions per no-op task, whole machine (perf), {broker}", "instr",
            machine[0], machine[1], "<= 1.03x plain", machine[1] <= 1.03 * machine[0],
            runs=runs, note=_spread(plain.machine_instructions, extras.machine_instructions)),
        Row(f"stats: instructions per no-op task, worker main process (perf), {broker}",
            "instr", main[0], main[1], "-", True, runs=runs,
            note=_spread(plain.main_instructions, extras.main_instructions)),
    ]  # fmt: skip


def _spread(*samples: list[float]) -> str:
    """The largest relative spread of the drains' figures, for the table's note."""
    worst = max((max(s) - min(s)) / statistics.median(s) for s in samples)
    return f"drains within {worst:.1%}"
