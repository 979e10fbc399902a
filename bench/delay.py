"""Delay store: limited backlogs, countdowns beyond the visibility timeout, and the cost per task.

One worker, prefork concurrency 2, Redis broker, ``acks_late``, each figure side by side:

* **20,000 queued at 40/s** (default visibility timeout): Celery's ``rate_limit="40/s"``;
  celery-extras' ``limit("40/s")`` with long waits held in the worker
  (``extras_limit_max_hold = 3600``, the former hand-back/hold path); and ``limit()`` with the
  delay store (default settings). Rate achieved (plain and held over the first
  :data:`WINDOW` s, the store over the whole run), the main process's RSS every
  :data:`SAMPLE` s (peak, and peak minus the idle worker's), and how long an unlimited task
  sent mid-run (every 30 s, to the same queue) waits before it starts. The RSS curves go to
  ``docs/_static/delay-rss.csv``.
* **Backlog curves**: 1k, 10k and 100k queued before the worker starts (the clock starts when
  it is ready): rate over the first 60 s (or over the run, if the backlog is done sooner) and
  peak RSS, plain ``rate_limit`` beside the delay store.
* **Countdowns**: 5,000 tasks with countdowns of 15 to 35 s, ``visibility_timeout`` 10 s: how
  many ran more than once, and peak RSS, Celery's ETA beside ``extras_eta_store``.
* **Cost**: the store work a parked task adds in the worker's main process (park, the mover's
  claim and release, take), in Redis round trips and microseconds, on loopback Redis.
"""

from __future__ import annotations

import csv
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Task, shared_task

from celery_extras import limit
from celery_extras.delay.entry import Entry
from celery_extras.delay.redis_store import RedisDelayStore, delay_keys
from celery_extras.delay.store import TakeStatus
from tests.support.brokers import REDIS_URL
from tests.support.journal import Journal

from .runs import Run
from .table import Row

__all__ = ["measure"]

INCLUDE = ("bench.delay",)
SHORT_VISIBILITY = {"visibility_timeout": 10, "unacked_restore_interval": 2,
                    "unacked_restore_throttle": 1}  # fmt: skip
RATE = 40.0
WINDOW = 150.0  # s of the 20k run measured for plain rate_limit and the held path
SAMPLE = 2.0  # s between RSS samples
PROBE_EVERY = 30.0  # s between unlimited tasks sent mid-run
CSV_PATH = Path(__file__).resolve().parent.parent / "docs" / "_static" / "delay-rss.csv"
CSV_STEP = 10  # s between rows of the CSV

#: the three ways of waiting compared: (plain Celery?, task, extra conf)
VARIANTS: dict[str, tuple[bool, str, dict[str, Any]]] = {
    "plain": (True, "bench.delay.plain40", {}),
    "held": (False, "bench.delay.limited40", {"extras_limit_max_hold": 3600.0}),
    "store": (False, "bench.delay.limited40", {}),
}


@shared_task(bind=True, name="bench.delay.countdown", acks_late=True)
def countdown(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


@shared_task(bind=True, name="bench.delay.plain40", rate_limit="40/s", acks_late=True)
def plain40(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


@limit("40/s", burst=1, scope="global")
@shared_task(bind=True, name="bench.delay.limited40", acks_late=True)
def limited40(self: Task, tag: Any = None) -> None:
    Journal(self.app.main or "bench").note(self, tag=tag)


@shared_task(bind=True, name="bench.delay.probe", acks_late=True)
def probe(self: Task, sent: float) -> None:
    """An unlimited task: journals when it was sent beside when it started."""
    Journal(self.app.main or "bench").note(self, tag=sent)


# -- cost per parked task ------------------------------------------------------------------


def cost_per_task(n: int = 2000, batch: int = 100) -> tuple[float, float]:
    """``(round trips, microseconds)`` of park + claim + release + take per entry."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    prefix = f"b{uuid.uuid4().hex[:10]}"
    store = RedisDelayStore(client, prefix)
    body = b'[[1], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'
    entries = [
        Entry("bench.task", f"id{i}", "limit", body, "application/json", "utf-8",
              {"id": f"id{i}", "task": "bench.task", "retries": 0, "eta": None},
              {"correlation_id": f"id{i}", "priority": 0, "delivery_mode": 2}, "q", "q", "q")
        for i in range(n)
    ]  # fmt: skip
    try:
        started = time.perf_counter()
        for i, entry in enumerate(entries):
            store.park(f"e{i}", entry, 0.0)
        claims = []
        trips = n
        while len(claims) < n:
            got = store.claim(0.0, 30.0, [f"k{len(claims) + j}" for j in range(batch)]).items
            trips += 1
            claims.extend(got)
        for claim in claims:
            store.release(claim.entry_id, claim.token, 600.0)
            entry_ = Entry.loads(claim.raw)
            assert (
                store.take(claim.entry_id, entry_.task_id, claim.token).status is TakeStatus.TAKEN
            )
        trips += 2 * n
        elapsed = time.perf_counter() - started
    finally:
        client.delete(*delay_keys(prefix).values())
    return trips / n, elapsed / n * 1e6


# -- 20,000 queued at 40/s -----------------------------------------------------------------


@dataclass
class Steady:
    """One variant's 20k run: times are seconds after the backlog was sent."""

    rate: float
    done: int
    span: float  # seconds the rate is over
    idle_kb: int
    peak_kb: int
    waits: list[float]  # probes' send-to-start waits (lower bounds for those not started)
    missed: int  # probes that had not started when the run ended
    curve: list[tuple[float, int]] = field(default_factory=list)  # (s, kB)
    publish_s: float = 0.0


def steady(variant: str, n: int = 20_000) -> Steady:
    """Send *n* limited tasks to a running worker, probe it every 30 s, sample its RSS."""
    plain, task, conf = VARIANTS[variant]
    whole_run = variant == "store"
    with Run(conf, plain, INCLUDE, SAMPLE) as run:
        run.start()
        idle = run.idle_kb()
        t0 = time.time()
        run.send(task, ((i,) for i in range(n)))
        publish_s = time.time() - t0
        end = t0 + (n / RATE + 60 if whole_run else WINDOW)
        probes_sent: list[float] = []
        while time.time() < end:
            now = time.time()
            if now >= t0 + PROBE_EVERY * (len(probes_sent) + 1) and now < end - 10:
                probes_sent.append(now)
                run.send("bench.delay.probe", [(now,)])
            if whole_run and len(run.journal) >= n + len(probes_sent):
                break
            time.sleep(0.5)
        stopped = time.time()
        assert run.sampler is not None
        runs = run.starts(task)
        started = {e["tag"]: e["t"] for e in run.starts("bench.delay.probe")}
        waits = [started.get(sent, stopped) - sent for sent in probes_sent]
        times = [e["t"] for e in runs]
        if whole_run:
            span = times[-1] - times[0] if len(times) > 1 else 0.0
            rate = (len(times) - 1) / span if span else 0.0
        else:
            span = WINDOW
            rate = sum(1 for t in times if t <= t0 + WINDOW) / WINDOW
        curve = [(t - t0, kb) for t, kb in run.sampler.samples]  # idle samples before 0
        return Steady(rate, len({e["tag"] for e in runs}), span, idle,
                      run.sampler.peak_kb(t0, stopped),
                      waits, sum(1 for sent in probes_sent if sent not in started), curve,
                      publish_s)  # fmt: skip


def write_curves(results: dict[str, Steady], path: Path = CSV_PATH) -> Path:
    """RSS (MB) of each variant every CSV_STEP s after the backlog was sent: the last sample
    at or before each step; empty once a variant's run had ended."""
    last = max(r.curve[-1][0] for r in results.values() if r.curve)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["t_s", *(f"{name}_mb" for name in results)])
        writer.writerow(["idle", *(f"{r.idle_kb / 1024:.1f}" for r in results.values())])
        for step in range(0, int(last) + 1, CSV_STEP):
            cells = []
            for r in results.values():
                before = [kb for t, kb in r.curve if t <= step]
                ended = not r.curve or step > r.curve[-1][0] + SAMPLE
                cells.append("" if ended or not before else f"{before[-1] / 1024:.1f}")
            writer.writerow([step, *cells])
    return path


# -- backlog curves ------------------------------------------------------------------------


def backlog(variant: str, n: int, window: float = 60.0) -> tuple[float, int, float]:
    """``(rate over the first *window* s, peak RSS kB, publish seconds)`` for *n* tasks
    queued before the worker starts; the clock starts when the worker is ready."""
    plain, task, conf = VARIANTS[variant]
    with Run(conf, plain, INCLUDE, SAMPLE) as run:
        t = time.time()
        run.send(task, ((i,) for i in range(n)))
        publish_s = time.time() - t
        t0 = run.start()
        end = t0 + window
        while time.time() < end and len(run.journal) < n:
            time.sleep(0.5)
        assert run.sampler is not None
        peak = run.sampler.peak_kb(t0, end)
        times = [e["t"] for e in run.starts(task)]
        if len(times) >= n and times[-1] - times[0] < window:  # done sooner: rate over the run
            rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
        else:
            rate = sum(1 for x in times if x <= end) / window
        return rate, peak, publish_s


# -- countdowns beyond the visibility timeout ----------------------------------------------


def countdowns(plain: bool, n: int = 5000) -> tuple[int, int, int, int]:
    """``(tasks that ran more than once, tasks that never ran, idle kB, peak RSS kB)`` for
    *n* countdowns of 15..35 s with a 10 s visibility timeout."""
    conf: dict[str, Any] = {"broker_transport_options": SHORT_VISIBILITY}
    if not plain:
        conf.update(extras_eta_store=True, extras_eta_threshold=5.0)
    with Run(conf, plain, INCLUDE, SAMPLE) as run:
        run.start()
        idle = run.idle_kb()
        t0 = time.time()
        _send_countdowns(run, n)
        deadline = t0 + 35 + 90
        while time.time() < deadline:
            if time.time() > t0 + 36 and len({e["tag"] for e in run.journal.entries()}) >= n:
                break
            time.sleep(2)
        time.sleep(12)  # a measurement period: late duplicates show up in it
        assert run.sampler is not None
        runs = Counter(e["tag"] for e in run.journal.entries())
        return (sum(1 for c in runs.values() if c > 1), n - len(runs), idle,
                run.sampler.peak_kb(t0))  # fmt: skip


def _send_countdowns(run: Run, n: int) -> None:
    with run.app.producer_or_acquire() as producer:
        for i in range(n):
            run.app.send_task("bench.delay.countdown", args=(i,), countdown=15 + 20 * i / n,
                              producer=producer)  # fmt: skip


# -- the table -----------------------------------------------------------------------------


def _mb(kb: int) -> float:
    return kb / 1024


def steady_rows(results: dict[str, Steady]) -> list[Row]:
    plain = results["plain"]
    rows: list[Row] = []
    for name, label in (("held", "held in worker"), ("store", "delay store")):
        r = results[name]
        ref = name == "held"  # the path the store replaces: shown, not held to the targets
        over = f"{WINDOW:.0f} s" if name == "held" else f"whole run, {r.span:.0f} s"
        rows += [
            Row(f"20k at 40/s, {label}: rate", "tasks/s", plain.rate, r.rate,
                "-" if ref else "40 +- 5%", ref or abs(r.rate - RATE) <= 0.05 * RATE,
                note=f"plain over {WINDOW:.0f} s, extras over {over}; "
                     f"extras ran {r.done:,} of 20,000"),
            Row(f"20k at 40/s, {label}: peak RSS", "MB", _mb(plain.peak_kb), _mb(r.peak_kb),
                "-", True, note=f"idle: plain {_mb(plain.idle_kb):.1f}, "
                                f"extras {_mb(r.idle_kb):.1f} MB"),
            Row(f"20k at 40/s, {label}: RSS above idle", "MB",
                _mb(plain.peak_kb - plain.idle_kb), _mb(r.peak_kb - r.idle_kb),
                "-" if ref else "<= 30", ref or r.peak_kb - r.idle_kb <= 30 * 1024,
                note="peak minus the idle worker's"),
            Row(f"20k at 40/s, {label}: unlimited task wait, max", "s", max(plain.waits),
                max(r.waits), "-" if ref else "< 1", ref or max(r.waits) < 1,
                runs=len(r.waits),
                note=f"median plain {statistics.median(plain.waits):.2f}, extras "
                     f"{statistics.median(r.waits):.2f} s; not started by the end (lower "
                     f"bounds): plain {plain.missed}/{len(plain.waits)}, extras "
                     f"{r.missed}/{len(r.waits)}"),
        ]  # fmt: skip
    return rows


def backlog_rows() -> list[Row]:
    rows: list[Row] = []
    for n in (1_000, 10_000, 100_000):
        rate_p, peak_p, pub_p = backlog("plain", n)
        rate_s, peak_s, pub_s = backlog("store", n)
        rows += [
            Row(f"{n:,} queued at 40/s: rate, first 60 s", "tasks/s", rate_p, rate_s,
                "40 +- 5%", abs(rate_s - RATE) <= 0.05 * RATE,
                note=f"extras: delay store; publishing took {pub_p:.0f} / {pub_s:.0f} s "
                     "before the worker started"),
            Row(f"{n:,} queued at 40/s: peak RSS", "MB", _mb(peak_p), _mb(peak_s), "-", True),
        ]  # fmt: skip
    return rows


def countdown_rows(n: int = 5000) -> list[Row]:
    dup_p, lost_p, idle_p, peak_p = countdowns(True, n)
    dup_s, lost_s, idle_s, peak_s = countdowns(False, n)
    return [
        Row(f"{n:,} countdowns 15-35 s, vt 10 s: ran twice", "tasks", dup_p, dup_s, "0",
            dup_s == 0 and lost_s == 0,
            note=f"plain: Celery ETA; extras: extras_eta_store; never ran: {lost_p} / {lost_s}"),
        Row(f"{n:,} countdowns: peak RSS", "MB", _mb(peak_p), _mb(peak_s), "<= plain",
            peak_s <= peak_p * 1.1,
            note=f"idle: {_mb(idle_p):.1f} / {_mb(idle_s):.1f} MB"),
    ]  # fmt: skip


def measure() -> list[Row]:
    trips, micros = cost_per_task()
    rows = [
        Row("parked task: store round trips", "trips", None, trips, "<= 4", trips <= 4,
            note="park, claim (batches of 100), release, take"),
        Row("parked task: store work", "us", None, micros, "<= 1000", micros <= 1000,
            note="loopback Redis, client side"),
    ]  # fmt: skip
    results = {name: steady(name) for name in VARIANTS}
    print(f"wrote {write_curves(results)}", flush=True)
    rows += steady_rows(results)
    rows += backlog_rows()
    rows += countdown_rows()
    return rows
