"""Celery's canvas under every policy: a policy changes when a message runs, never what
Celery does at its end.

Rows: chain, group, chord, chord of chords, link, link_error, ``self.replace``. Columns
(``tests/support/tasks_canvas.py``): a limited task (``limit("5/s", burst=1)``: it waits,
and past ``extras_limit_max_hold`` it is parked), a capped one (``concurrency(1)``: it
waits), a coalesced one (on its arguments: a canvas with the same step twice has one
covered), a retried one (``retry_policy()``: its first attempt fails) and an ETA task
parked in the delay store (a 1 s countdown, ``extras_eta_store`` over 0.5 s). Every step
adds 1, so each cell expects the same figures. One cluster (two prefork workers) per
broker serves every cell.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.canvas import Signature
from celery.result import AsyncResult

# imported here too: the producer stamps the send time of the coalesced tasks it knows
import tests.support.tasks_canvas as tasks
from tests.integration.conftest import Cluster, workers_for_module
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = (tasks.__name__,)
#: The countdown of the ETA column's steps, over ``extras_eta_threshold``: parked.
ETA = 1.0
TSUM, RECORD = "tests.canvas.tsum", "tests.canvas.record"


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def canvas(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Two workers of the canvas tasks on one broker, for the whole module."""
    with workers_for_module(request.param, Path(tmp_path_factory.mktemp("canvas")), INCLUDE,
                            extras_eta_store=True, extras_eta_threshold=0.5,
                            extras_limit_max_hold=0.2) as cluster:  # fmt: skip
        yield cluster


def step(app: Celery, column: str, *args: Any, fail: bool = False) -> Signature:
    """The column's task (``fail``: its failing one) as a signature of *args*."""
    sig: Signature = app.tasks[f"tests.canvas.{column}_{'fail' if fail else 'add'}"].s(*args)
    if column == "eta":
        sig.set(countdown=ETA)
    return sig


def frozen(app: Celery, tag: str) -> Signature:
    """``record.si(tag)`` with its id fixed now."""
    sig: Signature = app.tasks[RECORD].si(tag)
    sig.freeze()
    return sig


def recorded(cluster: Cluster, prefix: str) -> list[str]:
    """The tags of the callbacks that ran, of this cell (*prefix*)."""
    entries = Journal(cluster.ns).entries()
    return sorted(
        e["tag"] for e in entries if e["task"] == RECORD and str(e["tag"]).startswith(prefix)
    )


def chain_row(cluster: Cluster, column: str, cell: str) -> None:
    app = cluster.app
    steps = chain(step(app, column, 1), step(app, column), step(app, column))
    assert steps.delay().get(timeout=60) == 4


def group_row(cluster: Cluster, column: str, cell: str) -> None:
    app = cluster.app
    steps = [step(app, column, 1), step(app, column, 1), step(app, column, 2)]
    assert group(steps).apply_async().get(timeout=60) == [2, 2, 3]


def chord_row(cluster: Cluster, column: str, cell: str) -> None:
    app = cluster.app
    steps = [step(app, column, 1), step(app, column, 1), step(app, column, 2)]
    assert chord(steps, app.tasks[TSUM].s()).apply_async().get(timeout=60) == 7


def chord_of_chords_row(cluster: Cluster, column: str, cell: str) -> None:
    app = cluster.app
    tsum = app.tasks[TSUM]
    inner = [
        chord([step(app, column, 1), step(app, column, 1)], tsum.s()),
        chord([step(app, column, 2), step(app, column, 1)], tsum.s()),
    ]
    assert chord(inner, tsum.s()).apply_async().get(timeout=60) == (2 + 2) + (3 + 2)


def link_row(cluster: Cluster, column: str, cell: str) -> None:
    """Two messages of the same step, each with its callback: both callbacks run, once."""
    app = cluster.app
    links = [frozen(app, f"{cell}-{i}") for i in range(2)]
    sent = [step(app, column, 1).apply_async(link=link) for link in links]
    assert [AsyncResult(s.id, app=app).get(timeout=60) for s in links] == [
        f"{cell}-0",
        f"{cell}-1",
    ]
    assert [r.get(timeout=30) for r in sent] == [2, 2]
    assert recorded(cluster, cell) == [f"{cell}-0", f"{cell}-1"]


def link_error_row(cluster: Cluster, column: str, cell: str) -> None:
    """Two failing messages, each with its errback: both errbacks run, once; both fail."""
    app = cluster.app
    errbacks = [frozen(app, f"{cell}-{i}") for i in range(2)]
    sent = [step(app, column, 1, fail=True).apply_async(link_error=e) for e in errbacks]
    assert [AsyncResult(s.id, app=app).get(timeout=60) for s in errbacks] == [
        f"{cell}-0",
        f"{cell}-1",
    ]
    for result in sent:
        result.get(timeout=30, propagate=False)
        assert result.state == "FAILURE" and isinstance(result.result, ValueError)
    assert recorded(cluster, cell) == [f"{cell}-0", f"{cell}-1"]


def replace_row(cluster: Cluster, column: str, cell: str) -> None:
    """``self.replace(<column>_add(1))`` in a chain: the chain goes on after the replacement."""
    app = cluster.app
    countdown = ETA if column == "eta" else 0.0
    first = app.tasks["tests.canvas.replacer"].s(1, column, countdown)
    assert chain(first, step(app, column)).delay().get(timeout=60) == 3


ROWS: dict[str, Callable[[Cluster, str, str], None]] = {
    "chain": chain_row,
    "group": group_row,
    "chord": chord_row,
    "chord_of_chords": chord_of_chords_row,
    "link": link_row,
    "link_error": link_error_row,
    "replace": replace_row,
}


@pytest.mark.parametrize("column", tasks.COLUMNS)
@pytest.mark.parametrize("row", list(ROWS))
def test_canvas(canvas: Cluster, row: str, column: str) -> None:
    ROWS[row](canvas, column, f"{row}.{column}.{uuid.uuid4().hex[:6]}")


def test_each_column_made_its_tasks_wait_as_its_policy_says(canvas: Cluster) -> None:
    """The policies do act on these canvases (a cell that passed because its policy did
    nothing would prove nothing): a group of each column, then the workers' counters."""
    for column in tasks.COLUMNS:
        group_row(canvas, column, "")
    limited = group(step(canvas.app, "limited", i) for i in range(5))  # the last waits 0.8 s
    assert limited.apply_async().get(timeout=60) == [1, 2, 3, 4, 5]
    # four messages of one key, sent within the first's 50 ms run: sent before it started,
    # one is covered by it; after, the first is the key's waiting run and covers the rest
    # (the group row's two of a key may arrive either side of the first run's start)
    coalesced = group(step(canvas.app, "coalesced", 7) for _ in range(4))
    assert coalesced.apply_async().get(timeout=60) == [8, 8, 8, 8]

    def acted() -> dict[str, int]:
        stats = canvas.app.control.inspect(timeout=2).stats() or {}
        summed: dict[str, int] = {}
        for reply in stats.values():
            for name, figures in reply["extras"]["tasks"].items():
                column = name.removeprefix("tests.canvas.").rsplit("_", 1)[0]
                for counter, n in figures["total"].items():
                    summed[f"{column}.{counter}"] = summed.get(f"{column}.{counter}", 0) + n
        return summed

    wanted = ("limited.rate_limited", "limited.parked", "capped.concurrency_limited",
              "coalesced.coalesced", "retried.retried", "eta.parked", "eta.released")  # fmt: skip
    seen: dict[str, int] = {}

    def all_acted() -> bool:
        seen.update(acted())
        return all(seen.get(w, 0) > 0 for w in wanted)

    try:
        wait_for(all_acted, timeout=10, interval=0.5)
    finally:
        print({w: seen.get(w, 0) for w in wanted})
    assert all(seen[w] > 0 for w in wanted)
