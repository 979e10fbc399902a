"""extras top's frame: cluster sums, per-worker rows, rates per window, p95."""

from __future__ import annotations

import pytest

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
    assert lines[2].split() == ["task", "1s", "10s", "1m", "|", "recv", "ok", "fail", "retry",
                                "rej", "rvk", "rlim", "park", "p95ms"]  # fmt: skip
    cluster = lines[lines.index("cluster") + 1].split()
    # finished/s over 1 s, 10 s, 60 s; then the counts over 60 s; p95 (* the largest worker's)
    assert cluster[0] == "t.a"
    assert cluster[1:4] == ["6.0", "5.2", "5.1"]
    assert cluster[5:13] == ["306", "300", "6", "0", "0", "0", "0", "0"]
    assert cluster[-1] == "30.0*"
    w1 = lines[lines.index("w1@h") + 1].split()
    assert w1[1:4] == ["2.0", "2.1", "2.1"]
    assert w1[-1] == "10.0"


def test_frame_without_workers_says_it_is_waiting() -> None:
    assert "waiting for worker-throughput events" in render({}, now=0)


def many(hosts: int, tasks: int, name_length: int = 60) -> dict[str, Throughput]:
    workers = {}
    for h in range(hosts):
        host = f"worker-{h}@a-rather-long-host-name.example.org"
        f = figures(host, [1, 10, 60], [0, 1, 2], 0.004)
        task = f.tasks["t.a"]
        names = [f"proj.tasks.{i:03d}.".ljust(name_length, "x") for i in range(tasks)]
        workers[host] = Throughput(host, 0.0, (1, 10, 60, 3600), {
            n: TaskFigures({c: (*row, row[-1]) for c, row in task.counts.items()}, task.runtime)
            for n in names
        })  # fmt: skip
    return workers


@pytest.mark.parametrize(("width", "height"), [(80, 24), (100, 30), (200, 50), (40, 10)])
def test_every_line_fits_the_terminal_and_the_header_stays(width: int, height: int) -> None:
    frame = render(many(3, 12), now=0, width=width, height=height)
    lines = frame.splitlines()
    assert max(len(line) for line in lines) <= max(80, width)
    assert len(lines) <= max(height - 1, 5)
    assert lines[0].startswith("celery-extras top  3 worker(s)")
    assert lines[2].startswith("task")
    assert "more line(s): enlarge the terminal" in lines[-1]
    rows = [line for line in lines if line.startswith("  proj.tasks.")]
    cut = [row.split()[0].endswith("~") for row in rows]  # names cut, and marked
    assert rows and cut == [width <= 100] * len(rows)


def test_a_wide_terminal_shows_every_column_and_whole_names() -> None:
    frame = render(many(1, 2, name_length=40), now=0, width=200, height=50)
    lines = frame.splitlines()
    assert lines[2].split()[:5] == ["task", "1s", "10s", "1m", "1h"]
    assert {"recv", "rej", "rvk", "park", "ign"} <= set(lines[2].split())
    assert any(line.startswith("  " + "proj.tasks.000.".ljust(40, "x") + " ") for line in lines)


def test_at_80_columns_the_least_useful_columns_go_first() -> None:
    header = render(many(1, 1), now=0, width=80).splitlines()[2].split()
    assert header[:4] == ["task", "1s", "10s", "1m"]  # the hour rate went
    assert {"ok", "fail", "retry", "rlim"} <= set(header)


def test_waiting_parked_and_store_state_are_shown_per_worker_and_summed() -> None:
    w1 = figures("w1@h", [1, 1, 1], [0, 0, 0], None)
    w2 = figures("w2@h", [1, 1, 1], [0, 0, 0], None)
    ok, down = {"policies": "ok", "sync": "ok"}, {"policies": "down", "sync": "ok"}
    w1 = Throughput(
        w1.hostname, 0.0, w1.windows, w1.tasks, {"waiting": 3, "parked": 5, "store": ok}
    )
    w2 = Throughput(
        w2.hostname, 0.0, w2.windows, w2.tasks, {"waiting": 1, "parked": 5, "store": down}
    )
    lines = render({"w1@h": w1, "w2@h": w2}, now=0).splitlines()
    assert "cluster  waiting 4  parked 5" in lines  # parked: the shared store, not summed
    assert "w1@h  waiting 3  parked 5  store ok" in lines
    assert "w2@h  waiting 1  parked 5  store policies down" in lines


def test_control_characters_in_names_are_escaped() -> None:
    host = "evil\x1b[2J@h".replace("\\x1b", "\x1b")
    evil = figures(host, [1, 1, 1], [0, 0, 0], None)
    evil = Throughput(host, 0.0, evil.windows,
                      {"t\x1b]0;pwned\x07\u202e": evil.tasks["t.a"]})  # fmt: skip
    frame = render({host: evil}, now=0, width=120)
    assert "\x1b" not in frame and "\x07" not in frame and "\u202e" not in frame
    assert "evil\\x1b[2J@h" in frame and "t\\x1b]0;pwned\\x07\\u202e" in frame


def test_a_worker_with_fewer_windows_is_named_not_shown_in_the_columns() -> None:
    """A worker configured with other windows (fewer than the first's) used to crash the
    frame with an IndexError, as its counts were read per column of the first's."""
    first = figures("w1@h", [1, 2, 3], [0, 0, 0], None)
    few = figures("w2@h", [1, 2], [0, 0], None)
    few = Throughput(few.hostname, 0.0, (1, 10), few.tasks)
    lines = render({"w1@h": first, "w2@h": few}, now=0).splitlines()
    assert "  (not in the cluster sums, other windows: w2@h)" in lines
    assert "w2@h  (windows 1s, 10s)" in lines
