"""install(app) on real workers: tasks run, the step reports itself, bad settings stop the start."""

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
    assert installed["capabilities"] == ["sync", "policies", "consumer", "stats"]


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"extras_key_prefx": "x"}, "extras_key_prefx: unknown celery-extras setting; "
                                    "did you mean extras_key_prefix?"),
        ({"extras_redis_url": "amqp://x"}, "extras_redis_url: expected a redis://"),
    ],
)  # fmt: skip
def test_bad_setting_stops_the_worker_start_with_its_name(
    cluster: Cluster, conf: dict[str, Any], message: str
) -> None:
    cluster.configure(**conf)
    worker = cluster.worker("bad", start=False).start(wait=False)
    wait_for(lambda: not worker.alive(), timeout=60, what="worker to exit")
    assert worker.proc is not None and worker.proc.returncode != 0
    assert message in worker.log()
