"""``python -m bench admission``: the figures the admission pipeline must hold.

The redesign of issue #23 (one admission pipeline for limits and concurrency)
must cost nothing on the hot paths: each row here is measured before and after
it, on the same machine in one sitting, from the same bench code. Issue #37's rows
follow (:mod:`.gates`): each gate's cost to a no-op task, and to the store.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from . import concurrency, gates, policies, stats
from .table import Row

__all__ = ["measure"]

BACKLOG = 3000
BACKLOG_RATE = 100.0


def measure() -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-admission-") as tmp:
        for name in stats.BROKERS:
            plain, extras = stats.throughput(name, Path(tmp))
            rows.append(
                Row(f"no-op tasks drained, prefork c=2, {name}", "tasks/s", plain.rate,
                    extras.rate, ">= 0.97x plain", extras.rate >= 0.97 * plain.rate,
                    runs=stats.PAIRS, note=stats.pair_ratios(plain.rates, extras.rates))
            )  # fmt: skip
    global_ms = policies.global_acquire_ms()
    rows.append(Row("global acquire p50 (loopback Redis)", "ms", None, global_ms, "<= 0.3",
                    global_ms <= 0.3, note="one Lua script call"))  # fmt: skip
    samples = sorted(concurrency.hand_over_ms())
    p95 = samples[max(0, round(0.95 * len(samples)) - 1)]
    rows.append(Row("concurrency(1): release on A -> waiter starts on B, p95", "ms", None, p95,
                    "<= 50", p95 <= 50.0, runs=len(samples),
                    note=f"p50 {statistics.median(samples):.1f} ms"))  # fmt: skip
    rate = policies.achieved_rate("bench.policies.global100", False, 1, BACKLOG, 120)
    met = abs(rate - BACKLOG_RATE) <= 0.05 * BACKLOG_RATE
    rows.append(Row(f"{BACKLOG:,} queued, limit 100/s global, 1 worker: rate", "tasks/s", None,
                    rate, "100 +- 5%", met))  # fmt: skip
    without, with_hooks = stats.hook_cost_us()
    rows.append(Row("stats hooks in one task's main-process path (in-process)", "us", without,
                    with_hooks, "-", True, runs=5))  # fmt: skip
    return rows + gates.measure()
