"""extras top's frame: cluster sums, per-worker rows, rates per window, p95."""

from __future__ import annotations

from celery_extras.stats.monitor import render
from celery_extras.stats.recorder import COUNTERS
from celery_extras.stats.schema import TaskFigures, Throughput


def figures(host: str, succeeded: list[int], failed: list[int], p95: float | None) -> Throughput:
    counts = {c: tuple(0 for _ in succeeded) for c in COUNTERS}
    counts["succeeded"] = tuple(succeeded)
    counts["failed"] = tuple(failed)
    counts["received"] = tuple(s + f for s, f in zip(succeeded, failed, strict=True))
    runtime = {"count": 1.0, "sum": 1.0, "max": 1.0, "p50": p95, "p95": p95, "p99": p95}
    return Throughput(host, 0.0, (1, 10, 60), {"t.a": TaskFigures(counts, runtime)})


def test_frame_sums_workers_and_shows_rates_counts_and_p95() -> None:
    workers = {
        "w1@h": figures("w1@h", [2, 20, 120], [0, 1, 6], 0.010),
        "w2@h": figures("w2@h", [3, 30, 180], [1, 1, 0], 0.030),
    }
    frame = render(workers, malformed=4, now=0)
    lines = frame.splitlines()
    assert "2 worker(s)" in lines[0] and "malformed events: 4" in lines[0]
    cluster = lines[lines.index("cluster") + 1].split()
    # finished/s over 1 s, 10 s, 60 s; then recv ok fail retry rej rvk rlim over 60 s; p95 (max)
    assert cluster[0] == "t.a"
    assert cluster[1:4] == ["6.0", "5.2", "5.1"]
    assert cluster[5:12] == ["306", "300", "6", "0", "0", "0", "0"]
    assert cluster[-2:] == ["30.0", "(max)"]
    w1 = lines[lines.index("w1@h") + 1].split()
    assert w1[1:4] == ["2.0", "2.1", "2.1"]
    assert w1[-1] == "10.0"


def test_frame_without_workers_says_it_is_waiting() -> None:
    assert "waiting for worker-throughput events" in render({}, now=0)
