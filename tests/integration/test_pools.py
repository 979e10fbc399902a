"""The capabilities on the threads, gevent and eventlet pools (real workers, Redis).

Celery monkey-patches the process for ``-P gevent`` and ``-P eventlet`` before anything
else is imported, so the threads celery-extras starts in the worker's main process (the
delay mover, the revoke sync, the release notices' listener) run as green threads there,
and a task's end is heard from a green thread (threads: from a pool thread). One worker
per pool, concurrency 4, small counts: a global ``limit("10/s")`` keeps ~10/s, a
``concurrency(2)`` cap is never exceeded, a ``coalesce`` key queued 20 times runs once
and every caller gets that run's result, and ETA tasks parked in the delay store run
once, not before their ETA (on gevent: not before its timer fires them, see ``EARLY``).
The worker logs no error; the store rounds of the threads pool's event loop go on its
admission line, the green pools' (no event loop) are calls.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import pytest

# imported here too: this process is the producer, and a producer stamps the send time on
# the messages of the coalesced tasks it knows
import tests.support.tasks_coalesce  # noqa: F401
from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.rates import JITTER, busiest_second
from tests.support.workers import WorkerProcess, wait_for

#: Rates are asserted (under pytest-xdist these run alone).
pytestmark = pytest.mark.exclusive

INCLUDE = (
    "tests.support.tasks_delay",
    "tests.support.tasks_concurrency",
    "tests.support.tasks_coalesce",
)
LIMITED10 = "tests.delay.limited10"  # limit("10/s", burst=1, scope="global")
GLOBAL2 = "tests.concurrency.global2"  # concurrency(2), 0.2 s a run
PER_KEY = "tests.coalesce.per_key"  # coalesce(key=args[0])
ETA_TASK = "tests.delay.eta_task"
#: s an ETA task may start before its ETA: the released task waits in Celery's timer, and
#: gevent's fires by its loop's clock, cached at the loop's turn: plain Celery's ETA tasks
#: on -P gevent started up to 0.7 ms early here (1 of 40), celery-extras' 0.1 and 2.8 ms.
EARLY = {"gevent": 0.01}


def of(journal: Journal, task: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in journal.entries()
        if e["task"] == task and all(e.get(k) == v for k, v in fields.items())
    ]


def most_at_once(intervals: Iterable[tuple[float, float]]) -> int:
    """The largest number of *intervals* open at one instant (an end before a start)."""
    pairs = list(intervals)
    events = sorted([(s, 1) for s, _ in pairs] + [(e, -1) for _, e in pairs])
    running = peak = 0
    for _t, step in events:
        running += step
        peak = max(peak, running)
    return peak


def eta_parked(cluster: Cluster, worker: WorkerProcess) -> int:
    gate: dict[str, Any] = cluster.stats(worker.hostname).get("extras_delay_gate") or {}
    return int(gate.get("eta_parked", 0))


def problems(log: str) -> list[str]:
    """The log's error lines and tracebacks."""
    return [line for line in log.splitlines()
            if "ERROR/" in line or "CRITICAL/" in line or "Traceback" in line]  # fmt: skip


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
@pytest.mark.parametrize("pool", ["threads", "gevent", "eventlet"])
def test_limit_concurrency_coalesce_and_eta_store_hold_on_the_pool(
    cluster: Cluster, send: Callable[..., Any], journal: Journal, pool: str
) -> None:
    cluster.configure(include=INCLUDE, extras_eta_store=True, extras_eta_threshold=1.0)
    queued = [send(PER_KEY, "k", f"q{i}") for i in range(20)]
    worker = cluster.worker(f"{pool}1", concurrency=4, pool=pool)
    banner = {"threads": "thread", "gevent": "gevent", "eventlet": "eventlet"}[pool]
    assert f"concurrency: 4 ({banner})" in worker.log(), worker.log()[:3000]

    # ETA tasks 4 to 6 s ahead: parked (threshold 1 s), released by the mover
    now = time.time()
    dues = [now + 4.0 + 2.0 * i / 19 for i in range(20)]
    for i, due in enumerate(dues):
        send(ETA_TASK, i, due, eta=datetime.fromtimestamp(due, UTC))

    # coalesce: queued 20 times before the worker started, one run, every caller its result
    values = [r.get(timeout=60) for r in queued]
    runs = of(journal, PER_KEY, phase="end")
    assert len(runs) == 1, runs
    assert {v["run"] for v in values} == {runs[0]["id"]}

    # concurrency(2) on 4 pool slots: never more than 2 at once, and 2 at once
    for i in range(16):
        send(GLOBAL2, i)
    wait_for(lambda: len(of(journal, GLOBAL2, phase="end")) >= 16, timeout=60, interval=0.2,
             what="16 global2 runs")  # fmt: skip
    ends = of(journal, GLOBAL2, phase="end")
    assert sorted(e["tag"] for e in ends) == list(range(16))  # each exactly once
    assert most_at_once((e["start"], e["t"]) for e in ends) == 2

    # a global limit("10/s") with burst 1
    for i in range(40):
        send(LIMITED10, i)
    wait_for(lambda: len(of(journal, LIMITED10)) >= 40, timeout=60, interval=0.2,
             what="40 limited10 runs")  # fmt: skip
    limited = of(journal, LIMITED10)
    assert Counter(e["tag"] for e in limited) == Counter(range(40))
    times = sorted(e["t"] for e in limited)
    rate = (len(times) - 1) / (times[-1] - times[0])
    print(f"\n{pool}: limit 10/s ran {rate:.2f}/s, busiest second {busiest_second(times)}")
    assert 9.5 <= rate <= 10.5, f"{rate:.2f}/s for 10/s on {pool}"
    assert busiest_second(times) <= (10 + 1) * JITTER

    # the ETA tasks: parked, each run once, none before its ETA
    wait_for(lambda: len(of(journal, ETA_TASK)) >= 20, timeout=30, interval=0.2,
             what="20 ETA runs")  # fmt: skip
    time.sleep(1.0)  # a measurement period: a late duplicate shows up in it
    etas = of(journal, ETA_TASK)
    assert Counter(e["tag"] for e in etas) == Counter(range(20))
    early = min(e["t"] - e["due"] for e in etas)
    assert early >= -EARLY.get(pool, 0.0), f"an ETA task ran {-early:.3f} s before its ETA"
    assert eta_parked(cluster, worker) == 20

    # the threads pool runs Celery's event loop: arrivals' rounds go on its line (endings,
    # heard in pool threads, are calls); gevent and eventlet have no event loop: calls
    line = cluster.stats(worker.hostname)["extras_store_line"]
    assert (line["rounds"] > 0, line["failed"]) == (pool == "threads", 0), line

    assert not problems(worker.log()), "\n".join(problems(worker.log())[:20])
