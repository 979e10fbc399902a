"""install(app) on real workers: tasks run and the step reports itself.

Bad settings stopping the worker start: tests/reliability/test_bad_input.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.workers import wait_for


def test_installed_worker_runs_tasks_and_reports_itself(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    worker = cluster.worker("w1")
    results = [send("tests.noop", i) for i in range(20)]
    assert sorted(r.get(timeout=30) for r in results) == list(range(20))
    assert sorted(e["tag"] for e in journal.entries()) == list(range(20))

    stats = wait_for(
        lambda: cluster.app.control.inspect(destination=[worker.hostname], timeout=2).stats(),
        what="inspect stats",
    )
    installed = stats[worker.hostname]["extras_install"]
    assert installed["capabilities"] == ["sync", "policies", "delay", "consumer", "stats"]
