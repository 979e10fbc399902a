"""The command line: ``extras limit`` refusals, ``--show`` and ``--reset``; one-line errors.

Every command runs as a real ``celery -A tests.support.proj extras ...`` process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from tests.integration.conftest import Cluster
from tests.support import proj
from tests.support.workers import ROOT, wait_for

STATS_TASKS = ("tests.support.tasks_stats",)
LIMITED = "tests.stats.limited"  # limit("5/s", burst=1, scope="global")


def extras(cluster: Cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **proj.worker_env(cluster.broker, cluster.ns, cluster.conf,
                                           cluster.include)}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.support.proj", "extras", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error a command printed, checked to be one line and no traceback."""
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_options_out_of_range_and_a_port_in_use_give_one_line_errors(cluster: Cluster) -> None:
    cluster.configure(include=STATS_TASKS)
    for args, culprit in (
        (["top", "--refresh", "-1"], "'--refresh'"),
        (["top", "--refresh", "nan"], "'--refresh'"),
        (["top", "--iterations", "0"], "'--iterations'"),
        (["exporter", "--port", "70000"], "'--port'"),
        (["exporter", "--port", "-5"], "'--port'"),
        (["limit", "--show", "--reset", LIMITED], "--show and --reset"),
        (["limit", LIMITED], "TASK_NAME and RATE"),
    ):
        done = extras(cluster, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert culprit in one_line_error(done), (args, done.stderr)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = extras(cluster, "exporter", "--port", str(port))
    assert done.returncode == 1, done.stderr
    assert one_line_error(done) == (
        f"Error: cannot serve on 127.0.0.1:{port}: Address already in use"
    )


def test_limit_refuses_unlimited_tasks_shows_and_resets(
    cluster: Cluster, send: Callable[..., Any]
) -> None:
    cluster.configure(include=STATS_TASKS)
    worker = cluster.worker("cli1", concurrency=1)

    # a task with no limit(), and a misspelled one: refused, nothing stored
    for name in ("tests.stats.succeeds", "tests.stats.limitd"):
        done = extras(cluster, "limit", name, "5/s")
        assert done.returncode == 1, done.stdout + done.stderr
        error = one_line_error(done)
        assert f"{name}: no worker limits this task" in error and LIMITED in error, error
    shown = extras(cluster, "limit", "--show")
    assert shown.returncode == 0, shown.stderr
    assert f"{LIMITED}: limit(5/s, burst=1, scope=global); no stored rate" in shown.stdout
    assert "tests.stats.succeeds" not in shown.stdout and "limitd" not in shown.stdout

    # set, shown stored and in force on the worker
    done = extras(cluster, "limit", LIMITED, "7/s")
    assert done.returncode == 0, done.stderr
    assert f"{worker.hostname}: {LIMITED}: 7/s (burst 1, global)" in done.stdout, done.stdout
    shown = extras(cluster, "limit", "--show", LIMITED)
    assert f"{LIMITED}: limit(5/s, burst=1, scope=global); stored rate 7/s" in shown.stdout
    assert f"  {worker.hostname}: 7/s burst 1 (stored rate, global)" in shown.stdout

    # a worker started now says at start that the stored rate replaces its limit()
    later = cluster.worker("cli2", concurrency=1)
    wait_for(lambda: f"{LIMITED} runs at the stored rate 7/s, not its limit() 5/s" in later.log(),
             timeout=30, what="the start-up line about the stored rate")  # fmt: skip
    assert later.log().count("runs at the stored rate") == 1

    # reset: removed from the store, each worker back to its limit()
    done = extras(cluster, "limit", "--reset", LIMITED)
    assert done.returncode == 0, done.stderr
    for host in (worker.hostname, later.hostname):
        assert f"{host}: {LIMITED}: back to 5/s (burst 1, global)" in done.stdout, done.stdout
    shown = extras(cluster, "limit", "--show", LIMITED)
    assert f"{LIMITED}: limit(5/s, burst=1, scope=global); no stored rate" in shown.stdout
    assert f"  {worker.hostname}: 5/s burst 1 (limit(), global)" in shown.stdout
    # and the limited task still runs
    assert send(LIMITED, 1).get(timeout=60) == 1
