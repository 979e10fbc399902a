"""``python -m bench gates``: what each gate costs a no-op task in the worker, and the store.

A task with a policy pays for its gates in the worker's main process, the bottleneck of a
Celery worker, and in the store (issue #37). Two prefork workers (``-c 2``, Redis broker),
plain Celery and celery-extras, each started once and warmed; the store is a private
``redis-server``, so that its ``INFO commandstats`` counts the gates' calls alone. For each
task of :mod:`bench.gate_tasks` (each gate set so that it never binds), :data:`ROUNDS`
alternating pairs of drains of :data:`BACKLOG` queued tasks, each worker draining alone
(the other paused): plain Celery's no-op task, then the gated one. Figures: the best rate
of each side and their ratio, and per admitted task the store's script calls (each one
round trip: every store call of a gate is a script, but the rounds the worker's admission
line wrote together, counted by the worker) and the Redis server's CPU time, the store's
own background (timers, threads) measured while idle and taken off; the CPU time each
worker's main process used over its drain, per task; and the whole machine's (every
process, the kernel's too: ``/proc/stat``), which bounds the ratio once the drains keep
every core busy: a side that costs the machine more CPU per task drains slower by as much.
Each row's note gives every pair's ratio too (its two drains next to each other in time),
as their median and quartiles: on a VM whose speed moves from one minute to the next, they
show how far one sitting's best-of figure may be from the typical one. ``--pairs N`` makes
N pairs instead of :data:`ROUNDS`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support.brokers import PrivateRedis, require_broker

from .runs import cpu_seconds, machine_cpu_seconds
from .stats import Drainer, pair_ratios
from .table import Row

__all__ = ["GATES", "StoreCounter", "measure"]

INCLUDE = ("bench.gate_tasks",)
PLAIN = "bench.gates.plain"
#: (task, what it has, the least share of plain Celery's rate it must reach, if any)
GATES: tuple[tuple[str, str, float | None], ...] = (
    ("bench.gates.worker_limit", "limit(worker)", None),
    ("bench.gates.global_limit", "limit(global)", 0.93),
    ("bench.gates.global_slots", "concurrency(global)", None),
    ("bench.gates.coalesced", "coalesce(distinct keys)", None),
    ("bench.gates.all_three", "limit + concurrency + coalesce", 0.85),
)
BACKLOG = 2000
ROUNDS = 3  # pairs of drains per gate: the best of each side
IDLE = 5.0  # s the idle store's background is counted over
#: what the idle background, measured apart, may leave in a drain's script calls per task
NOISE = 0.02
#: the commands that run a script (one round trip each)
SCRIPTS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


class StoreCounter:
    """The store on a private ``redis-server`` (no persistence), and what it counts."""

    def __init__(self, workdir: Path) -> None:
        self.server = PrivateRedis(workdir, "--appendonly", "no").start()
        self.url = self.server.url
        self.client = redis.Redis.from_url(self.url)

    def totals(self) -> tuple[int, float]:
        """Script calls served so far (each one round trip of a gate: every store call of a
        gate is a script), and the server's CPU time (us, ``INFO cpu``: commandstats counts
        a script's own commands again inside it)."""
        stats = self.client.info("commandstats")
        calls = sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPTS)
        cpu = self.client.info("cpu")
        return calls, 1e6 * (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))

    def stop(self) -> None:
        self.client.close()
        self.server.stop()


@dataclass
class GateFigures:
    task: str
    label: str
    floor: float | None  # the least share of plain Celery's rate it must reach
    plain: list[float] = field(default_factory=list)  # rates
    extras: list[float] = field(default_factory=list)
    trips: list[float] = field(default_factory=list)  # store round trips per task, idle off
    usec: list[float] = field(default_factory=list)  # store CPU per task, idle off
    #: the worker main process's CPU per task (us), each side: the bottleneck of a worker
    main_plain: list[float] = field(default_factory=list)
    main_extras: list[float] = field(default_factory=list)
    #: the whole machine's CPU per task (us), each side: every process, the store's too
    box_plain: list[float] = field(default_factory=list)
    box_extras: list[float] = field(default_factory=list)

    @property
    def target(self) -> str:
        return "-" if self.floor is None else f">= {self.floor}x plain"

    def met(self) -> bool:
        return self.floor is None or max(self.extras) >= self.floor * max(self.plain)


def _background(store: StoreCounter) -> tuple[float, float]:
    """Script calls and CPU us per second of the idle store (the workers' timers, threads)."""
    calls, usec = store.totals()
    time.sleep(IDLE)
    calls2, usec2 = store.totals()
    return (calls2 - calls) / IDLE, (usec2 - usec) / IDLE


def _batched(drainer: Drainer) -> int:
    """Script calls the worker's admission line saved so far: the rounds it sent that
    went in the same write as another (``inspect stats``)."""
    stats = drainer.app.control.inspect(destination=[drainer.worker.hostname], timeout=5).stats()
    line = (stats or {}).get(drainer.worker.hostname, {}).get("extras_store_line", {})
    return int(line.get("rounds", 0)) - int(line.get("writes", 0))


def _per_task(seconds: float) -> float:
    """*seconds* of a drain's CPU, in us per task of :data:`BACKLOG`."""
    return 1e6 * seconds / BACKLOG


def run(broker_name: str = "redis", rounds: int = ROUNDS) -> list[GateFigures]:
    broker = require_broker(broker_name)
    figures = [GateFigures(task, label, floor) for task, label, floor in GATES]
    with tempfile.TemporaryDirectory(prefix="bench-gates-") as tmp:
        store = StoreCounter(Path(tmp))
        plain = Drainer(broker, True, Path(tmp), INCLUDE)
        extras = Drainer(broker, False, Path(tmp), INCLUDE, {"extras_redis_url": store.url})
        try:
            plain.start(warm=(PLAIN,))
            extras.start(warm=tuple(one.task for one in figures))
            for _ in range(rounds):
                for one in figures:
                    used, box = cpu_seconds(plain.worker.pid), machine_cpu_seconds()
                    one.plain.append(BACKLOG / plain.drain(BACKLOG, extras.worker, PLAIN))
                    one.main_plain.append(_per_task(cpu_seconds(plain.worker.pid) - used))
                    one.box_plain.append(_per_task(machine_cpu_seconds() - box))
                    per_s, usec_per_s = _background(store)
                    calls, usec = store.totals()
                    batched = _batched(extras)
                    used, box = cpu_seconds(extras.worker.pid), machine_cpu_seconds()
                    seconds = extras.drain(BACKLOG, plain.worker, one.task)
                    one.main_extras.append(_per_task(cpu_seconds(extras.worker.pid) - used))
                    one.box_extras.append(_per_task(machine_cpu_seconds() - box))
                    calls2, usec2 = store.totals()
                    batched = _batched(extras) - batched
                    one.extras.append(BACKLOG / seconds)
                    one.trips.append((calls2 - calls - batched - per_s * seconds) / BACKLOG)
                    one.usec.append((usec2 - usec - usec_per_s * seconds) / BACKLOG)
        finally:
            plain.stop()
            extras.stop()
            store.stop()
    return figures


def rows(figures: list[GateFigures], broker_name: str = "redis") -> list[Row]:
    out = []
    for one in figures:
        trips, usec = min(one.trips), min(one.usec)
        out.append(Row(
            f"{BACKLOG:,} queued no-op tasks, {one.label}, prefork c=2, {broker_name}",
            "tasks/s", max(one.plain), max(one.extras), one.target, one.met(), runs=len(one.plain),
            note=f"store per task: {trips:.2f} round trips, {usec:.0f} us of Redis CPU; the "
                 f"worker's main process: {min(one.main_extras):.0f} us of CPU per task (plain "
                 f"{min(one.main_plain):.0f}); the machine: {min(one.box_extras):.0f} us (plain "
                 f"{min(one.box_plain):.0f}); {pair_ratios(one.plain, one.extras)}",
        ))  # fmt: skip
    every = figures[-1]
    usec, trips = min(every.usec), min(every.trips)
    out.append(Row(
        f"store round trips per task, {every.label}, {broker_name}", "trips", None, trips,
        "<= 2 (1 on arrival, 1 at the end)", trips <= 2.0 + NOISE, runs=len(every.trips),
        note="script calls (INFO commandstats) of a private store, less those the admission "
             "line wrote with another, its idle background (measured apart) off: within "
             f"{NOISE} of a whole count",
    ))  # fmt: skip
    out.append(Row(
        f"Redis CPU per admitted task, {every.label}, {broker_name}", "us", None, usec, "-", True,
        runs=len(every.usec),
        note=f"one Redis core: ~{1e6 / usec:,.0f} admissions/s" if usec > 0 else "",
    ))  # fmt: skip
    plain, extras = min(every.box_plain), min(every.box_extras)
    out.append(Row(
        f"the machine's CPU per task, {every.label}, {broker_name}", "us", plain, extras, "-",
        True, runs=len(every.box_extras),
        note=f"{os.cpu_count()} cores, every process (workers, pool, broker, store, kernel): "
             f"with every core busy, extras drains at most {plain / extras:.2f}x plain's rate",
    ))  # fmt: skip
    return out


def measure(argv: Sequence[str] = ()) -> list[Row]:
    """Both brokers (the store is Redis either way); ``--pairs N``: N alternating pairs of
    drains per gate (:data:`ROUNDS` by default)."""
    parser = argparse.ArgumentParser(prog="python -m bench gates")
    parser.add_argument("--pairs", type=int, default=ROUNDS, help="pairs of drains per gate")
    pairs = parser.parse_args(list(argv)).pairs
    if pairs < 1:
        parser.error(f"--pairs must be 1 or more, not {pairs}")
    return [row for name in ("redis", "rabbitmq") for row in rows(run(name, pairs), name)]
