"""Fork safety: pool processes forked while celery-extras' threads work (issue #33).

A prefork pool forks the worker's main process at start, and again for every child it
replaces (``--max-tasks-per-child``, ``--autoscale``, a child that died). A fork copies
every lock as it is, but only the forking thread: a lock another thread held then (a module
import lock under ``socket.getaddrinfo`` -> ``encodings.idna``, a connection pool's) stays
held for ever in the child, which hangs at its first use of it. celery-extras runs threads
in the main process (the delay mover, the revoke sync), so this bench forks while they work,
plain Celery (the same app without ``celery_extras.install``) side by side:

* **starts**: *N* worker starts (prefork ``-c 2``, Redis broker and Redis result backend, so
  a pool process connects at its first task). The app parks (``extras_eta_store`` and a
  worker-scope ``limit()`` task, so the mover runs) and syncs revokes (the default). Before
  each start, ETA tasks due over the next seconds are parked (by the previous start's
  worker), worker-limited tasks are queued and revokes are sent, so the mover and the sync
  threads work while the pool forks. After each start, :data:`PROBES` short tasks that
  return their pool process's pid are sent, until every pool process ``inspect stats``
  lists has answered (a hung child never runs the tasks handed to it) or the deadline
  passes: a start is hung when a pool process did not answer. Each worker is stopped with
  SIGTERM, SIGKILL after a deadline, and no process of it may be left.
* **mtpc**: ``--max-tasks-per-child=1`` (a fork per task), prefork ``-c 2``, *M* short tasks
  while a parked backlog of ETA tasks due during the run is released and revokes are sent:
  tasks done, hung pool processes (``inspect active``: a task that runs for ever), wall time.

Workers start with :mod:`bench.launch` (``celery`` without the Flower plug-in the ``dev``
extra installs: it imports the ``idna`` codec at start, which hides the import lock of
issue #33); ``--plugins`` starts them with ``celery`` itself. That lock is held for a
millisecond or two, next to the pool's first fork: ``--slow-import SECONDS`` holds it
longer (the import itself slowed, see bench/launch.py), so that a fork inside it is certain
where the code lets one happen.

The logs of hung workers and of stops that needed SIGKILL are kept (``--logs``), with the
stacks of the frozen worker's threads (Celery's SIGUSR1 dump) and, when ``py-spy`` is on
the PATH or named by ``BENCH_PY_SPY``, of each of its processes.

``python -m bench forks [--starts N] [--tasks M] [--backlog B] [--only starts|mtpc]
[--variants plain,extras] [--quick] [--plugins] [--slow-import S] [--logs DIR]``; under any virtual
environment's Python (``.venv-celery56/bin/python -m bench forks``). ``--quick`` is
``--starts 5 --tasks 100 --backlog 100`` (what ``tests/reliability/test_fork_safety.py``
runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import celery
import redis
from celery import Task, shared_task

from celery_extras import limit
from tests.support import proj
from tests.support.brokers import REDIS_URL, require_broker
from tests.support.journal import Journal
from tests.support.workers import WorkerProcess

from .table import Row

__all__ = [
    "Bench",
    "Churn",
    "Start",
    "Starts",
    "measure",
    "mtpc_run",
    "one_start",
    "probe",
    "start_runs",
    "stop_worker",
]

INCLUDE = ("bench.forks",)
PID = "bench.forks.pid"
ETA = "bench.forks.eta"
LIMITED = "bench.forks.limited"

STARTS = 100  # worker starts per variant
TASKS = 2_000  # tasks of the --max-tasks-per-child=1 run
BACKLOG = 2_000  # ETA tasks released during it
PROBES = 8  # tasks sent to a started worker at a time
PROBE_SECONDS = 0.3  # each probe's run: long enough that both pool processes take some
DEADLINE = 20.0  # s for every pool process of a started worker to answer
STOP_DEADLINE = 15.0  # s from SIGTERM to SIGKILL
PARKED = 150  # ETA tasks parked for the next start, due over its first seconds
LIMITED_PER_START = 20  # worker-limited (5/s) tasks queued before each start
REVOKES_PER_START = 10
STALL = 45.0  # s without a task done after which the mtpc run is over
RUNNING_FOR_EVER = 20.0  # s a short task must have run to count as hung
#: the mtpc run's backlog falls due over (tasks + backlog) x this many s (~8 forks/s here)
SPAN_PER_FORK = 0.12

#: celery-extras' settings (plain Celery: none): ETA tasks 1 s or more ahead are parked
EXTRAS_CONF: dict[str, Any] = {"extras_eta_store": True, "extras_eta_threshold": 1.0}

_journals: dict[str, Journal] = {}


def _journal(task: Task) -> Journal:
    ns = task.app.main or "bench"
    return _journals.get(ns) or _journals.setdefault(ns, Journal(ns))


@shared_task(bind=True, name=PID)
def pid(self: Task, seconds: float = 0.0, tag: Any = None) -> int:
    """Its pool process's pid (stored in the result backend); journals its run when tagged."""
    if seconds:
        time.sleep(seconds)
    if tag is not None:
        _journal(self).note(self, tag=tag)
    return os.getpid()


@shared_task(bind=True, name=ETA, ignore_result=True)
def eta(self: Task, tag: Any = None) -> None:
    _journal(self).note(self, tag=tag)


@limit("5/s", scope="worker")
@shared_task(bind=True, name=LIMITED, ignore_result=True)
def limited(self: Task, tag: Any = None) -> None:
    _journal(self).note(self, tag=tag)


# -- processes -----------------------------------------------------------------------


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group *pgid*, from ``/proc``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


#: py-spy, to write a frozen worker's pool processes' stacks to its log (optional)
PY_SPY = os.environ.get("BENCH_PY_SPY") or shutil.which("py-spy")


def dump_stacks(worker: WorkerProcess) -> None:
    """Write the stacks of a frozen worker to its log: its main process's threads (Celery's
    SIGUSR1 handler), and every process of its group with py-spy, when there is one."""
    with suppress(ProcessLookupError, subprocess.TimeoutExpired):
        os.kill(worker.pid, signal.SIGUSR1)
        assert worker.proc is not None
        worker.proc.wait(2)
    if not PY_SPY:
        return
    for member in group_members(worker.pid):
        with suppress(OSError, subprocess.SubprocessError):
            dump = subprocess.run([PY_SPY, "dump", "--pid", str(member)], capture_output=True,
                                  text=True, timeout=30)  # fmt: skip
            with open(worker.log_path, "a") as log:
                log.write(f"\n--- py-spy dump of {member}:\n{dump.stdout}{dump.stderr}\n")


def stop_worker(worker: WorkerProcess, deadline: float = STOP_DEADLINE) -> tuple[bool, int]:
    """SIGTERM (warm shutdown), SIGKILL to the whole group after *deadline* s (the main
    process's threads' stacks logged first): ``(exited on SIGTERM, processes left after
    SIGKILL)``."""
    if worker.proc is None:
        return True, 0
    clean = True
    if worker.alive():
        os.kill(worker.pid, signal.SIGTERM)
        try:
            worker.proc.wait(deadline)
        except subprocess.TimeoutExpired:
            clean = False
            dump_stacks(worker)
    worker.stop(timeout=0)  # SIGKILL to the group (pool children left), reaps the main one
    left = group_members(worker.pid)
    end = time.monotonic() + 5
    while left and time.monotonic() < end:
        for member in left:
            with suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)
        time.sleep(0.1)
        left = group_members(worker.pid)
    return clean, len(left)


def _lines(log: str, *needles: str) -> int:
    return sum(1 for line in log.splitlines() if any(n in line for n in needles))


# -- one namespace -------------------------------------------------------------------


class Bench:
    """One namespace (plain Celery or celery-extras): its app, its workers (one at a time),
    and on exit every worker stopped and every key of the namespace deleted."""

    def __init__(
        self, plain: bool, logs: Path | None = None, plugins: bool = False, slow: float = 0.0
    ) -> None:
        self.plain = plain
        self.plugins = plugins  # False: workers start with bench.launch (no Flower plug-in)
        self.label = "plain" if plain else "extras"
        self.broker = require_broker("redis")
        self.ns = f"f{uuid.uuid4().hex[:10]}"
        self.conf = {} if plain else dict(EXTRAS_CONF)
        self.app = proj.make_app(self.broker, self.ns, self.conf, INCLUDE, plain)
        self.env = proj.worker_env(self.broker, self.ns, self.conf, INCLUDE, plain)
        if slow:
            assert not plugins, "the import is slowed by bench.launch"
            self.env["BENCH_SLOW_IMPORT"] = str(slow)
        self.journal = Journal(self.ns)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"bench-forks-{self.label}-"))
        self.logs = logs  # the logs of hung workers and of stops that needed SIGKILL
        self.worker: WorkerProcess | None = None
        self.redis = redis.Redis.from_url(REDIS_URL)

    def start(self, name: str, args: Sequence[str] = ()) -> WorkerProcess:
        self.worker = WorkerProcess(name, self.env, self.tmp / f"{name}.log", concurrency=2,
                                    args=args)  # fmt: skip
        if not self.plugins:
            assert self.worker.argv[1:3] == ["-m", "celery"], self.worker.argv
            self.worker.argv[1:3] = ["-m", "bench.launch", "celery"]
        return self.worker.start(wait=False)

    def keep_log(self, worker: WorkerProcess, why: str) -> str:
        """Copy *worker*'s log to the logs directory; its path ("" when there is none)."""
        if self.logs is None:
            return ""
        self.logs.mkdir(parents=True, exist_ok=True)
        target = self.logs / f"{self.label}-{self.ns}-{worker.name}-{why}.log"
        shutil.copyfile(worker.log_path, target)
        return str(target)

    def pool_processes(self, worker: WorkerProcess) -> list[int] | None:
        """The pool processes ``inspect stats`` lists (``None``: no answer)."""
        stats = self.app.control.inspect(destination=[worker.hostname], timeout=5).stats()
        try:
            return list((stats or {})[worker.hostname]["pool"]["processes"])
        except (KeyError, TypeError):
            return None

    def stuck(self, worker: WorkerProcess, older: float) -> set[int] | None:
        """Pool processes running a task started more than *older* s ago (``None``: the
        worker did not answer ``inspect active``)."""
        active = self.app.control.inspect(destination=[worker.hostname], timeout=5).active()
        if not active or worker.hostname not in active:
            return None
        now = time.time()
        return {
            int(task["worker_pid"])
            for task in active[worker.hostname]
            if task.get("time_start") and now - float(task["time_start"]) > older
        }

    def queued(self) -> int:
        return int(self.redis.llen(self.ns))

    def send(self, name: str, args: Sequence[tuple[Any, ...]], **options: Any) -> list[str]:
        ids = []
        with self.app.producer_or_acquire() as producer:
            for one in args:
                ids.append(self.app.send_task(name, args=one, producer=producer, **options).id)
        return ids

    def park_ahead(self, count: int, first: float, last: float) -> list[str]:
        """Send *count* ETA tasks due between *first* and *last* s from now."""
        now = time.time()
        ids = []
        with self.app.producer_or_acquire() as producer:
            for i in range(count):
                due = now + first + (last - first) * i / max(count - 1, 1)
                result = self.app.send_task(ETA, args=(f"eta-{i}",), producer=producer,
                                            eta=datetime.fromtimestamp(due, UTC))  # fmt: skip
                ids.append(result.id)
        return ids

    def revoke(self, ids: Sequence[str]) -> None:
        for one in ids:
            self.app.control.revoke(one)

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.worker is not None:
                stop_worker(self.worker, deadline=5.0)
        finally:
            try:
                for key in self.redis.scan_iter(f"*{self.ns}*", count=1000):
                    self.redis.delete(key)
            finally:
                self.redis.close()
                self.app.close()
                shutil.rmtree(self.tmp, ignore_errors=True)


@contextmanager
def _revoking(bench: Bench, every: float = 0.2) -> Iterator[list[int]]:
    """Revoke a new (unknown) id every *every* s until the block ends; yields ``[sent]``."""
    done = threading.Event()
    sent = [0]

    def run() -> None:
        while not done.wait(every):
            try:
                bench.app.control.revoke(uuid.uuid4().hex)
                sent[0] += 1
            except Exception:  # the broker or store refused one: the next one may pass
                pass

    thread = threading.Thread(target=run, name="bench-revoker", daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        done.set()
        thread.join(10)


# -- starts --------------------------------------------------------------------------


@dataclass
class Start:
    """What one worker start showed."""

    ready: float | None  # s from spawn to ``ready.`` (None: not ready in time)
    processes: int  # pool processes inspect stats listed
    answered: int  # of them, those that ran a probe
    hung: int  # pool processes that never ran a probe
    clean_stop: bool
    left: int  # processes left after the SIGKILL
    lost: int  # WorkerLostError lines in the log
    up_timeouts: int  # "Timed out waiting for UP message" lines (a child killed by billiard)
    log: str = ""  # the log kept (hung starts)


@dataclass
class Starts:
    """The starts of one variant."""

    label: str
    runs: list[Start] = field(default_factory=list)

    @property
    def hung(self) -> int:
        return sum(1 for s in self.runs if s.hung or s.ready is None)

    @property
    def hung_processes(self) -> int:
        return sum(s.hung for s in self.runs)

    @property
    def unclean(self) -> int:
        return sum(1 for s in self.runs if not s.clean_stop)

    @property
    def left(self) -> int:
        return sum(s.left for s in self.runs)

    @property
    def ready_median(self) -> float:
        times = [s.ready for s in self.runs if s.ready is not None]
        return statistics.median(times) if times else float("nan")

    def count(self, attr: str) -> int:
        return sum(int(getattr(s, attr)) for s in self.runs)


def probe(bench: Bench, worker: WorkerProcess, deadline: float = DEADLINE) -> tuple[int, int, int]:
    """Send probes until every pool process has answered or *deadline* s have passed:
    ``(processes listed, answered, hung)``."""
    end = time.monotonic() + deadline
    answered: set[int] = set()
    processes: list[int] | None = None
    while True:
        results = [bench.app.AsyncResult(i) for i in
                   bench.send(PID, [(PROBE_SECONDS,)] * PROBES)]  # fmt: skip
        while time.monotonic() < end and not all(r.ready() for r in results):
            time.sleep(0.1)
        answered |= {int(r.result) for r in results if r.ready() and isinstance(r.result, int)}
        if processes is None or not set(processes) <= answered:
            processes = bench.pool_processes(worker) or processes
        everyone = processes is not None and set(processes) <= answered
        if everyone or time.monotonic() >= end:
            break
    listed = processes if processes is not None else []
    hung = len(set(listed) - answered) if listed else max(0, 2 - len(answered))
    return len(listed), len(answered & set(listed)) if listed else len(answered), hung


def one_start(bench: Bench, k: int, deadline: float = DEADLINE, parked: int = PARKED) -> Start:
    """Start the namespace's worker once (ETA tasks parked by the previous start due now,
    worker-limited tasks queued, revokes sent), probe its pool, park ETA tasks for the
    next start, stop it."""
    bench.send(LIMITED, [(f"lim-{k}-{i}",) for i in range(LIMITED_PER_START)])
    bench.revoke([uuid.uuid4().hex for _ in range(REVOKES_PER_START)])
    worker = bench.start(f"s{k}")
    spawned = time.monotonic()
    ready: float | None = None
    processes = answered = hung = 0
    try:
        try:
            worker.wait_ready(timeout=60)
            ready = time.monotonic() - spawned
        except AssertionError:
            pass
        if ready is not None:
            processes, answered, hung = probe(bench, worker, deadline)
            # for the next start: parked now (threshold 1 s), due while it forks its pool
            bench.park_ahead(parked, 4.0, 14.0)
            end = time.monotonic() + 5
            while bench.queued() and time.monotonic() < end:
                time.sleep(0.1)
    finally:
        clean, left = stop_worker(worker)
    log = worker.log()
    start = Start(
        ready=ready, processes=processes, answered=answered, hung=hung, clean_stop=clean,
        left=left, lost=_lines(log, "WorkerLostError"),
        up_timeouts=_lines(log, "Timed out waiting for UP message"),
    )  # fmt: skip
    why = "hung" if hung or ready is None else "" if clean and not left else "stop"
    if why:
        start.log = bench.keep_log(worker, why)
    worker.log_path.unlink(missing_ok=True)
    return start


def start_runs(
    n: int,
    variants: Sequence[bool] = (True, False),
    *,
    logs: Path | None = None,
    deadline: float = DEADLINE,
    parked: int = PARKED,
    plugins: bool = False,
    slow: float = 0.0,
    verbose: bool = True,
) -> list[Starts]:
    """*n* starts of each variant (``True``: plain Celery), interleaved start by start."""
    out = [Starts("plain" if plain else "extras") for plain in variants]
    with ExitStack() as stack:
        benches = [stack.enter_context(Bench(plain, logs, plugins, slow)) for plain in variants]
        for bench in benches:  # a first round parks what the first counted start releases
            bench.park_ahead(parked, 4.0, 14.0)
        for k in range(n):
            for bench, starts in zip(benches, out, strict=True):
                start = one_start(bench, k, deadline, parked)
                starts.runs.append(start)
                if verbose and (start.hung or start.ready is None or not start.clean_stop
                                or start.left):  # fmt: skip
                    print(f"  {starts.label} start {k + 1}: {start}", flush=True)
            if verbose and ((k + 1) % 10 == 0 or k + 1 == n):
                print(f"  starts {k + 1}/{n}: " + ", ".join(
                    f"{s.label} hung {s.hung}" for s in out), flush=True)  # fmt: skip
    return out


# -- max-tasks-per-child -------------------------------------------------------------


@dataclass
class Churn:
    """One ``--max-tasks-per-child=1`` run."""

    label: str
    tasks: int
    done: int
    backlog: int
    backlog_ran: int
    hung: int  # pool processes found running a task for ever (None answered: counted 2)
    wall: float  # s from the first task sent to the last one done (or to the stall)
    stalled: bool
    revokes: int
    clean_stop: bool
    left: int
    lost: int
    up_timeouts: int
    log: str = ""


def mtpc_run(
    plain: bool,
    tasks: int = TASKS,
    backlog: int = BACKLOG,
    *,
    logs: Path | None = None,
    stall: float = STALL,
    plugins: bool = False,
    slow: float = 0.0,
    verbose: bool = True,
) -> Churn:
    """*tasks* tasks on a ``--max-tasks-per-child=1`` worker while *backlog* ETA tasks are
    released and revokes are sent."""
    with Bench(plain, logs, plugins, slow) as bench:
        worker = bench.start("mtpc", ("--max-tasks-per-child=1",))
        try:
            worker.wait_ready(timeout=60)
            # the backlog falls due over about as long as the run takes (the same for both)
            span = (tasks + backlog) * SPAN_PER_FORK
            bench.park_ahead(backlog, 5.0, 5.0 + span)
            end = time.monotonic() + 60
            while bench.queued() and time.monotonic() < end:  # all received (parked or held)
                time.sleep(0.2)
            with _revoking(bench) as revokes:
                first = time.time()
                bench.send(PID, [(0.0, i) for i in range(tasks)])
                want = tasks + backlog
                seen, last_change = len(bench.journal), time.monotonic()
                stalled = False
                while seen < want:
                    time.sleep(0.5)
                    now_seen = len(bench.journal)
                    if now_seen != seen:
                        seen, last_change = now_seen, time.monotonic()
                    elif time.monotonic() - last_change > stall:
                        stalled = True
                        break
            entries = bench.journal.entries()
            main = [e for e in entries if e["task"] == PID and isinstance(e["tag"], int)]
            done = len({e["tag"] for e in main})
            ran = len({e["tag"] for e in entries if e["task"] == ETA})
            # to the last task done; a run that did not finish: to the stall
            wall = max((e["t"] for e in main), default=first) - first
            if done < tasks:
                wall = time.time() - (time.monotonic() - last_change) - first
            stuck = bench.stuck(worker, RUNNING_FOR_EVER)
            # the main process does not answer: its two children, if the run stalled
            hung = (2 if stalled else 0) if stuck is None else len(stuck)
            last = max((e["t"] for e in entries), default=first)
            rate = (done + ran) / max(last - first, 0.001)
            if verbose:
                print(f"  {bench.label}: {done}/{tasks} done, backlog {ran}/{backlog}, hung "
                      f"{hung}, {wall:.0f} s ({rate:.1f} tasks/s, a fork each)",
                      flush=True)  # fmt: skip
        finally:
            clean, left = stop_worker(worker)
        log = worker.log()
        churn = Churn(
            label=bench.label, tasks=tasks, done=done, backlog=backlog, backlog_ran=ran,
            hung=hung, wall=wall, stalled=stalled, revokes=revokes[0], clean_stop=clean,
            left=left, lost=_lines(log, "WorkerLostError"),
            up_timeouts=_lines(log, "Timed out waiting for UP message"),
        )  # fmt: skip
        if hung or done < tasks or not clean or left:
            churn.log = bench.keep_log(worker, "mtpc-hung" if hung or done < tasks else "mtpc-stop")
        return churn


# -- the tables ----------------------------------------------------------------------


def _pair(results: Sequence[Any], label: str) -> Any:
    return next((r for r in results if r.label == label), None)


def start_rows(results: Sequence[Starts], n: int) -> list[Row]:
    plain, extras = _pair(results, "plain"), _pair(results, "extras")
    main = extras or plain
    assert main is not None

    def fig(r: Starts | None, attr: str) -> float | None:
        return None if r is None else float(getattr(r, attr))

    def both(attr: str) -> str:
        return " / ".join("-" if r is None else str(r.count(attr)) for r in (plain, extras))

    note = (f"prefork -c 2, Redis broker + backend, ETA store + worker limit() + revoke sync "
            f"busy; plain / extras: hung pool processes {both('hung')}, WorkerLostError "
            f"lines {both('lost')}, UP timeouts {both('up_timeouts')}")  # fmt: skip
    return [
        Row(f"{n} worker starts: a pool process hung", "starts", fig(plain, "hung"),
            float(main.hung), "0", main.hung == 0, runs=n, note=note),
        Row(f"{n} worker starts: stop needed SIGKILL", "starts", fig(plain, "unclean"),
            float(main.unclean), "0", main.unclean == 0, runs=n,
            note=f"SIGTERM, SIGKILL after {STOP_DEADLINE:.0f} s; processes left after it: "
                 f"{' / '.join('-' if r is None else str(r.left) for r in (plain, extras))}"),
        Row(f"{n} worker starts: spawn to ready (median)", "s", fig(plain, "ready_median"),
            main.ready_median, "-", True, runs=n),
    ]  # fmt: skip


def mtpc_rows(results: Sequence[Churn]) -> list[Row]:
    plain, extras = _pair(results, "plain"), _pair(results, "extras")
    main = extras or plain
    assert main is not None
    m, b = main.tasks, main.backlog

    def fig(r: Churn | None, attr: str) -> float | None:
        return None if r is None else float(getattr(r, attr))

    def both(attr: str) -> str:
        return " / ".join("-" if r is None else str(getattr(r, attr)) for r in (plain, extras))

    stops = " / ".join("-" if r is None else "yes" if r.clean_stop else "no (SIGKILL)"
                       for r in (plain, extras))  # fmt: skip

    note = (f"prefork -c 2, Redis, {b:,} ETA tasks released during the run, revokes sent "
            f"every 0.2 s; plain / extras: backlog ran {both('backlog_ran')}, stalled "
            f"{both('stalled')}, WorkerLostError lines {both('lost')}, UP timeouts "
            f"{both('up_timeouts')}, stopped on SIGTERM {stops}")  # fmt: skip
    return [
        Row(f"--max-tasks-per-child=1, {m:,} tasks: done", "tasks", fig(plain, "done"),
            float(main.done), f"= {m:,}", main.done == m, note=note),
        Row(f"--max-tasks-per-child=1, {m:,} tasks: hung pool processes", "procs",
            fig(plain, "hung"), float(main.hung), "0", main.hung == 0),
        Row(f"--max-tasks-per-child=1, {m:,} tasks: wall time", "s", fig(plain, "wall"),
            main.wall, "-", True),
    ]  # fmt: skip


def _options(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench forks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--starts", type=int, default=STARTS, help="worker starts per variant")
    parser.add_argument("--tasks", type=int, default=TASKS, help="tasks of the mtpc run")
    parser.add_argument(
        "--backlog", type=int, default=BACKLOG, help="ETA tasks released during the mtpc run"
    )
    parser.add_argument(
        "--parked",
        type=int,
        default=PARKED,
        help="ETA tasks parked before each start, due while it starts",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEADLINE,
        help="s for every pool process of a started worker to answer",
    )
    parser.add_argument("--only", choices=("starts", "mtpc"), help="one scenario only")
    parser.add_argument(
        "--variants", default="plain,extras", help="plain, extras or plain,extras (default)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="--starts 5 --tasks 100 --backlog 100 (the CI test's counts)",
    )
    parser.add_argument(
        "--plugins",
        action="store_true",
        help="start workers with the celery command itself, every celery.commands plug-in "
        "loaded (Flower's imports the idna codec first; default: bench.launch, without)",
    )
    parser.add_argument(
        "--slow-import",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the worker's first import of encodings.idna takes SECONDS longer, its import "
        "lock held (bench/launch.py): issue #33's window, widened from a millisecond or two",
    )
    parser.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="where the logs of hung workers and of stops that needed SIGKILL are copied "
        "(default: bench-forks-logs in the temporary directory)",
    )
    options = parser.parse_args(list(argv))
    if options.quick:
        options.starts, options.tasks, options.backlog = 5, 100, 100
    return options


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the workers are stopped on the way out


def measure(argv: Sequence[str] = ()) -> list[Row]:
    options = _options(argv)
    labels = [v.strip() for v in options.variants.split(",") if v.strip()]
    assert set(labels) <= {"plain", "extras"} and labels, options.variants
    variants = [label == "plain" for label in ("plain", "extras") if label in labels]
    logs = options.logs or Path(tempfile.gettempdir()) / "bench-forks-logs"
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    print(f"  Celery {celery.__version__}, Python {sys.version.split()[0]}; hung workers' "
          f"logs go to {logs}", flush=True)  # fmt: skip
    rows: list[Row] = []
    if options.only in (None, "starts"):
        started = time.monotonic()
        results = start_runs(options.starts, variants, logs=logs, deadline=options.deadline,
                             parked=options.parked, plugins=options.plugins,
                             slow=options.slow_import)  # fmt: skip
        rows += start_rows(results, options.starts)
        print(f"  starts: {time.monotonic() - started:.0f} s", flush=True)
    if options.only in (None, "mtpc"):
        runs = [mtpc_run(plain, options.tasks, options.backlog, logs=logs,
                         plugins=options.plugins, slow=options.slow_import)
                for plain in variants]  # fmt: skip
        rows += mtpc_rows(runs)
    return rows
