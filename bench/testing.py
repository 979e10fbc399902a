"""The users' pytest plugin: wall time of each documented example test, run as a user runs
it (pytest on ``docs/examples/test_user_tasks.py`` copied out of the repository), beside
the time its waits span, which a test on plain Celery and a real clock waits at least."""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from .table import Row

__all__ = ["measure"]

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "test_user_tasks.py"
RUNS = 3
#: test -> (what it shows, seconds its waits span on the clock it simulates)
SPANS = {
    "test_a_limit_of_one_a_second_over_thirty_tasks": ("1/s limit, 30 tasks", 29.0),
    "test_a_retry_policy_waits_2_4_and_8_seconds": ("retries at 2, 4, 8 s", 14.0),
    "test_a_coalesced_key_runs_once_for_twenty_messages": ("coalesced key, 20 msgs", 0.0),
    "test_a_concurrency_cap_of_two": ("concurrency cap 2, 6 tasks", 0.0),
    "test_a_parked_eta_task_runs_once_when_due": ("ETA task a day ahead", 86400.0),
}
_DURATION = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+\S+::(\w+)", re.M)


def _one_run(workdir: Path) -> dict[str, float]:
    """Each test's setup + call + teardown, in seconds, from pytest's durations."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--durations=0",
         "-vv", EXAMPLE.name],
        cwd=workdir, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(f"the example tests failed:\n{run.stdout[-3000:]}")
    totals: dict[str, float] = defaultdict(float)
    for seconds, _phase, test in _DURATION.findall(run.stdout):
        totals[test] += float(seconds)
    return totals


def measure() -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        shutil.copy(EXAMPLE, workdir / EXAMPLE.name)
        runs = [_one_run(workdir) for _ in range(RUNS)]
    note = ("plain: the waits the test spans, which a real clock waits at least (not run); "
            "extras: the test's wall time, setup and teardown included")  # fmt: skip
    rows = []
    for test, (what, span) in SPANS.items():
        wall = statistics.median(run[test] for run in runs)
        rows.append(Row(f"testing plugin: {what}", "s", span or None, wall, "< 2 s",
                        wall < 2.0, runs=RUNS, note=note))  # fmt: skip
    return rows
