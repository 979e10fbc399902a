"""Fair queues: per-queue shares and a trickle queue's wait under a flood, plain vs weighted.

On Redis and on RabbitMQ, one worker with concurrency 2, plain Celery and the
same worker with ``extras_queue_weights``, one after the other in one run:

* Shares: 600 backlogged 20 ms tasks in each of queues a and b, weights a:3 b:1;
  the a:b ratio over the first 400 completions (plain Celery: about 1).
* Trickle: 2,000 backlogged 20 ms tasks in queue a, weights a:1 b:10; once the
  flood runs, 40 tasks are sent to b 50 ms apart; the p95 of their wait from
  publish to start. Then a burst of 20 to b at once: its p95 cannot be below
  ~0.18 s on 2 processes (the 19th of 20 tasks of 20 ms starts after 9 rounds).

``python -m bench.consumer --plot`` also draws ``docs/_static/consumer-flood.png``
from the Redis run (matplotlib, a dev dependency).
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from kombu import Connection

from tests.support import proj
from tests.support.brokers import require_broker
from tests.support.flood import p95
from tests.support.journal import Journal
from tests.support.workers import WorkerProcess, wait_for

from .table import Row

__all__ = ["measure", "plot"]

INCLUDE = ("tests.support.tasks_consumer",)
TASK = "tests.consumer.work"
TRICKLE = 40  # p95 of 40 waits: two stray scheduling hiccups do not decide it
PLOT = Path(__file__).resolve().parent.parent / "docs" / "_static" / "consumer-flood.png"

#: runs kept for the plot: {(scheme, scenario, "plain"|"extras"): journal entries}
RUNS: dict[tuple[str, str, str], list[dict[str, Any]]] = {}


class Run:
    """One worker (plain or weighted) on fresh namespaced queues a and b, cleaned up on exit."""

    def __init__(self, broker: str, weights: dict[str, int] | None, logdir: Path) -> None:
        self.broker = broker
        self.ns = f"bc{uuid.uuid4().hex[:10]}"
        self.queues = (f"{self.ns}.a", f"{self.ns}.b")
        plain = weights is None
        conf = {} if plain else {"extras_queue_weights": {f"{self.ns}.{q}": w
                                                          for q, w in weights.items()}}  # fmt: skip
        self.app = proj.make_app(broker, self.ns, conf, INCLUDE, plain)
        env = proj.worker_env(broker, self.ns, conf, INCLUDE, plain)
        self.worker = WorkerProcess("w", env, logdir / f"{self.ns}.log", concurrency=2,
                                    queues=self.queues)  # fmt: skip
        self.journal = Journal(self.ns)

    def publish(self, queue: str, n: int, label: str | None = None) -> None:
        with self.app.producer_or_acquire() as producer:
            for _ in range(n):
                self.app.send_task(TASK, args=(label or queue, time.time(), 0.02),
                                   queue=f"{self.ns}.{queue}", producer=producer)  # fmt: skip

    def labelled(self, label: str) -> list[dict[str, Any]]:
        return [e for e in self.journal.entries() if e["queue"] == label]

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        with Connection(self.broker) as conn:
            for queue in self.queues:
                try:
                    conn.default_channel.queue_delete(queue)
                except Exception as err:  # the bench reports, it does not stop on cleanup
                    print(f"could not delete {queue}: {err}")
        self.journal.clear()
        self.app.close()


def shares(broker: str, weighted: bool, logdir: Path) -> float:
    """a:b ratio over the first 400 completions of 600 + 600 backlogged tasks."""
    with Run(broker, {"a": 3, "b": 1} if weighted else None, logdir) as run:
        run.publish("a", 600)
        run.publish("b", 600)
        run.worker.start()
        wait_for(lambda: len(run.journal) >= 400, timeout=120, interval=0.2, what="400 runs")
        entries = sorted(run.journal.entries(), key=lambda e: e["t"])[:400]
        RUNS[(broker.split(":")[0], "shares", "extras" if weighted else "plain")] = entries
        first = Counter(e["queue"] for e in entries)
        return first["a"] / max(1, first["b"])


def trickle(broker: str, weighted: bool, logdir: Path) -> tuple[float, float]:
    """p95 publish-to-start wait of b's trickle, then of b's burst, under a flood of a."""
    with Run(broker, {"a": 1, "b": 10} if weighted else None, logdir) as run:
        run.publish("a", 2000)
        run.worker.start()
        wait_for(lambda: len(run.journal) >= 50, timeout=60, what="the flood to be under way")
        for _ in range(TRICKLE):
            run.publish("b", 1, label="trickle")
            time.sleep(0.05)
        wait_for(lambda: len(run.labelled("trickle")) >= TRICKLE, timeout=60, what="the trickle")
        run.publish("b", 20, label="burst")
        wait_for(lambda: len(run.labelled("burst")) >= 20, timeout=60, what="the burst")
        RUNS[(broker.split(":")[0], "trickle", "extras" if weighted else "plain")] = (
            run.journal.entries()
        )
        return (p95([e["waited"] for e in run.labelled("trickle")]),
                p95([e["waited"] for e in run.labelled("burst")]))  # fmt: skip


def measure() -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-consumer-") as tmp:
        logdir = Path(tmp)
        for name in ("redis", "rabbitmq"):
            broker = require_broker(name)
            plain_ratio, extras_ratio = shares(broker, False, logdir), shares(broker, True, logdir)
            (plain_t, plain_b), (extras_t, extras_b) = (trickle(broker, False, logdir),
                                                        trickle(broker, True, logdir))  # fmt: skip
            rows += [
                Row(f"{name}: a:b share, weights 3:1, first 400 of 600+600", "ratio",
                    plain_ratio, extras_ratio, "3 +- 0.3", abs(extras_ratio - 3) <= 0.3),
                Row(f"{name}: trickle p95 wait under a 2,000 flood", "s", plain_t, extras_t,
                    "<= 0.15 and 3x better", extras_t <= 0.15 and extras_t * 3 <= plain_t,
                    note=f"weights a:1 b:10, {TRICKLE} tasks to b 50 ms apart"),
                Row(f"{name}: burst p95 wait under a 2,000 flood", "s", plain_b, extras_b,
                    "better than plain", extras_b < plain_b,
                    note="20 tasks to b at once; floor ~0.18 s: 9 rounds of 20 ms"),
            ]  # fmt: skip
    return rows


def plot(path: Path = PLOT, broker: str = "redis") -> Path:
    """Per-queue completions over time (weights 3:1) and the trickle's waits, plain vs weighted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, style in (("plain", "--"), ("extras", "-")):
        entries = RUNS[(broker, "shares", kind)]
        t0 = entries[0]["t"]
        for queue, colour in (("a", "tab:blue"), ("b", "tab:orange")):
            times = [e["t"] - t0 for e in entries if e["queue"] == queue]
            label = f"{queue} ({'weights a:3 b:1' if kind == 'extras' else 'plain Celery'})"
            left.plot(times, range(1, len(times) + 1), style, color=colour, label=label)
    left.set(title="Both queues backlogged: completions per queue",
             xlabel="seconds since the first task started", ylabel="tasks completed")  # fmt: skip
    left.legend()
    for kind, colour in (("plain", "tab:red"), ("extras", "tab:green")):
        waits = [e["waited"] * 1000 for e in RUNS[(broker, "trickle", kind)]
                 if e["queue"] == "trickle"]  # fmt: skip
        label = "weights a:1 b:10" if kind == "extras" else "plain Celery"
        right.plot(range(1, len(waits) + 1), sorted(waits), "o-", color=colour,
                   label=f"{label} (p95 {p95(waits):.0f} ms)")  # fmt: skip
    right.set(title="Trickle to b under a 2,000-task flood of a",
              xlabel="b's tasks, sorted by wait", ylabel="publish to start (ms)")  # fmt: skip
    right.legend()
    fig.suptitle(f"One worker, concurrency 2, 20 ms tasks, {broker}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    from .table import render

    print(render(measure()))
    if "--plot" in sys.argv[1:]:
        print(f"wrote {plot()}")
