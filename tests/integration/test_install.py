"""install(app) on real workers: tasks run and the step reports itself; a worker whose app
has tasks with policies and no install(app) refuses to start.

Bad settings stopping the worker start: tests/reliability/test_bad_input.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

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
    assert installed["capabilities"] == [
        "sync", "policies", "delay", "consumer", "priority", "stats"
    ]  # fmt: skip


@pytest.mark.parametrize("broker", ["redis"], indirect=True)  # one worker start: CI time
def test_worker_of_an_app_without_install_refuses_to_start_naming_its_policy_tasks(
    cluster: Cluster,
) -> None:
    cluster.configure(include=("tests.support.tasks_delay",), plain=True, extras_plain=False)
    worker = cluster.worker("forgot", start=False).start(wait=False)
    wait_for(lambda: not worker.alive(), timeout=60, what="the worker to refuse to start")
    assert worker.proc is not None and worker.proc.returncode != 0
    log = worker.log()
    assert f"celery-extras is not installed on app {cluster.ns!r}" in log, log[-3000:]
    assert "tests.delay.limited10" in log and "call celery_extras.install(app)" in log
    assert "ready." not in log
