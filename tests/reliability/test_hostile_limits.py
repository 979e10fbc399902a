"""Hostile numbers for limits: refused where they enter, ignored when read back from the
store, and never a crashed worker (issue 17, items 1 and 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from celery_extras.stats.emitter import worker_state
from celery_extras.store.client import redis_client
from tests.integration.conftest import Cluster
from tests.support import proj
from tests.support.journal import Journal
from tests.support.workers import ROOT

INCLUDE = ("tests.support.tasks_reliability",)
LIMITED = "tests.reliability.limited"  # 10/s, burst 2, global

ABSURD = [
    ({"rate": "1e-300/s"}, "rate '1e-300/s': must be between one a day"),
    ({"rate": "1e308/s"}, "rate '1e308/s': must be between one a day"),
    ({"rate": 1e-300}, "rate 1e-300: must be between one a day"),
    ({"rate": "10/s", "burst": 10**30}, "burst 1000000000000000000000000000000: expected"),
    ({"rate": "1" * 1_000_000 + "/s"}, "(1000004 characters)"),
]


def _runs_limited(cluster: Cluster, send: Callable[..., Any], journal: Journal, n: int) -> None:
    results = [send(LIMITED, i) for i in range(n)]
    assert sorted(r.get(timeout=60) for r in results) == list(range(n))


def test_absurd_limit_by_control_command_is_refused_and_kills_no_worker(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """A rate of 1e-300/s used to be accepted with "ok"; the next limited task then ended
    the worker with ``OverflowError`` from ``timedelta(seconds=wait)``."""
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1")
    for arguments, error in ABSURD:
        answer = cluster.ask(worker, "extras_limit", task_name=LIMITED, **arguments)
        assert answer is not None, arguments.get("rate", "")[:40]
        assert "ok" not in answer, (arguments.get("rate", "")[:40], answer)
        assert error in answer["error"], answer
        assert len(answer["error"]) < 300  # a 1 MB argument gives a short reply, not 1 MB
    _runs_limited(cluster, send, journal, 12)  # the task's own 10/s still applies
    assert worker.alive()
    stats = cluster.app.control.inspect(timeout=5, destination=[worker.hostname]).stats()
    assert "override" not in stats[worker.hostname]["extras_policies"]["limits"][LIMITED]

    refused = _cli(cluster, "extras", "limit", LIMITED, "1e-300/s")  # the command line too
    assert refused.returncode != 0
    assert "rate '1e-300/s': must be between one a day" in refused.stderr
    assert redis_client(cluster.app).hgetall(f"{cluster.ns}:limits") == {}  # nothing stored


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
@pytest.mark.parametrize(
    "stored", [{"rate": 1e-300}, {"rate": 10, "burst": 10**30}], ids=["rate", "burst"]
)
def test_absurd_stored_rate_is_ignored_and_logged_once_by_new_workers(
    cluster: Cluster, send: Callable[..., Any], journal: Journal, stored: dict[str, Any]
) -> None:
    """A rate written to the store (by an older ``celery extras limit``, or by hand) used to
    make every worker started afterwards die at its first limited task."""
    cluster.configure(include=INCLUDE)
    store = redis_client(cluster.app)
    limits_key = f"{cluster.ns}:limits"
    store.hset(limits_key, LIMITED, json.dumps(stored))
    worker = cluster.worker("w1")
    _runs_limited(cluster, send, journal, 12)
    times = sorted(e["t"] for e in journal.entries())
    assert times[-1] - times[0] >= (12 - 2) / 10 - 0.05  # the task's own 10/s, burst 2
    assert worker.alive()
    log = worker.log()
    assert log.count(f"ignoring the stored run-time limit of '{LIMITED}'") == 1, log[-3000:]
    assert (
        "global limits: the store failed (" not in log
    )  # not an outage: global limits still apply


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_wrong_type_key_is_reported_as_such_with_redis_text(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """A key of the wrong type used to be logged as the store being unreachable
    (server:ResponseError)", without Redis' own words."""
    cluster.configure(include=INCLUDE)
    redis_client(cluster.app).set(f"{cluster.ns}:limits", "not a hash")
    worker = cluster.worker("w1")
    _runs_limited(cluster, send, journal, 6)
    log = worker.log()
    assert "global limits: the store failed (ResponseError" in log, log[-3000:]
    assert "WRONGTYPE" in log
    assert "global limits: the store failed (ConnectionError" not in log
    stats = cluster.app.control.inspect(timeout=5, destination=[worker.hostname]).stats()
    policies = stats[worker.hostname]["extras_policies"]
    assert policies["store"] == "down" and "WRONGTYPE" in policies["store_error"], policies
    rows = worker_state(stats[worker.hostname])["store"]  # celery_extras_store_up's rows
    assert rows["limits"] == rows["policies"] == "down", rows  # a policy's row, its own
    assert rows["concurrency"] == rows["coalesce"] == rows["memoize"] == "ok", rows


def _cli(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    env = proj.worker_env(cluster.broker, cluster.ns, cluster.conf, cluster.include)
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.support.proj", *argv],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
