"""Bad input gets a clear error or a logged drop: never a crashed worker, never a lost task."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.workers import WorkerProcess, wait_for

INCLUDE = ("tests.support.tasks_reliability",)


def still_serves(cluster: Cluster, worker: WorkerProcess, journal: Journal, tag: str) -> None:
    """The worker is alive and runs a new task."""
    assert worker.alive(), worker.log()[-3000:]
    assert cluster.app.send_task("tests.noop", args=(tag,)).get(timeout=30) == tag


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"task_name": "tests.reliability.limited", "rate": "fast"}, "fast"),
        ({"task_name": "tests.reliability.limited", "rate": "-5/s"}, "-5/s"),
        ({"task_name": "tests.reliability.limited", "rate": "10/s", "burst": 0}, "burst"),
        ({"task_name": "tests.reliability.limited", "rate": None}, "None"),
        ({"task_name": ["not", "a", "name"], "rate": "10/s"}, "not"),
        ({"rate": "10/s"}, "task_name"),
    ],
)
def test_malformed_limit_command_is_refused_with_a_reason(
    cluster: Cluster, journal: Journal, arguments: dict[str, Any], error: str
) -> None:
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1")
    answer = cluster.ask(worker, "extras_limit", **arguments)
    assert answer is not None, arguments
    assert "ok" not in answer and error in str(answer["error"]), answer
    still_serves(cluster, worker, journal, "after-bad-command")


def test_key_callable_that_cannot_handle_the_arguments_loses_no_task(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1")
    good = [send("tests.reliability.bad_key", {"customer": "a"}, i).id for i in range(5)]
    bad = [send("tests.reliability.bad_key", payload, i).id
           for i, payload in enumerate([5, None, {"no": "customer"}, "text", [1, 2]])]  # fmt: skip
    wait_for(
        lambda: {e["id"] for e in journal.entries()} >= {*good, *bad},
        timeout=60,
        what="every task, whatever its key= callable made of it",
    )
    assert "limit key of tests.reliability.bad_key failed" in worker.log()
    still_serves(cluster, worker, journal, "after-bad-keys")


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"extras_key_prefx": "x"},
            "extras_key_prefx: unknown celery-extras setting; did you mean extras_key_prefix?",
        ),
        ({"extras_redis_url": "amqp://x"}, "extras_redis_url: expected a redis://"),
        ({"extras_stats_interval": -1}, "extras_stats_interval: expected a number > 0"),
        ({"extras_stats_interval": "2"}, "extras_stats_interval: expected a number > 0"),
        ({"extras_stats_windows": [1, 10, 10**9]}, "extras_stats_windows"),
        ({"extras_limit_max_hold": float("inf")}, "extras_limit_max_hold"),
        ({"extras_limit_on_store_error": "explode"}, "extras_limit_on_store_error"),
        ({"extras_redis_url": "http://localhost"}, "extras_redis_url"),
    ],
)
def test_absurd_settings_stop_the_worker_start_with_the_setting_named(
    cluster: Cluster, conf: dict[str, Any], message: str
) -> None:
    cluster.configure(**conf)
    worker = cluster.worker("bad", start=False).start(wait=False)
    wait_for(lambda: not worker.alive(), timeout=60, what="the worker to refuse to start")
    assert worker.proc is not None and worker.proc.returncode != 0
    assert message in worker.log()
