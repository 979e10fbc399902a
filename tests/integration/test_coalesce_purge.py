"""``celery purge`` of a coalesced key's parked waiting run (issue 56): the messages it
covered (acked, their callers waiting) end ``REVOKED`` as Celery ends revoked tasks (no
callback, their chord fails), the purged waiting run itself is left as Celery leaves a
purged message (no state), and the key's next message runs once without ending them.

A real prefork worker parks the waiting run (held longer than ``extras_limit_max_hold``
while the key's run goes on); ``celery -A ... purge`` runs as a process of its own.
"""

from __future__ import annotations

from typing import Any

from celery import chord
from celery.result import AsyncResult

import tests.support.tasks_canvas
from tests.integration.conftest import Cluster, also_on_redis_cluster
from tests.integration.test_coalesce import coalesce_info
from tests.integration.test_delay_purge import celery
from tests.support.journal import Journal
from tests.support.workers import wait_for

CANVAS = (tests.support.tasks_canvas.__name__,)
CO, RECORD, TOTAL = "tests.canvas.co", "tests.canvas.record", "tests.canvas.total"


def _tags(journal: Journal, task: str) -> list[Any]:
    return [e["tag"] for e in journal.entries() if e["task"] == task]


def _frozen(app: Any, tag: str) -> Any:
    sig = app.tasks[RECORD].si(tag)
    sig.freeze()
    return sig


@also_on_redis_cluster("redis")
def test_purging_a_parked_waiting_run_ends_what_it_covered_revoked(
    cluster: Cluster, journal: Journal
) -> None:
    app = cluster.configure(include=CANVAS, extras_delay_max_hold=0.5)
    worker = cluster.worker("w1")
    co = app.tasks[CO]
    long = co.apply_async(("P", "long", 8.0))
    wait_for(lambda: "long" in _tags(journal, CO), timeout=30, what="the long run")
    waiting = co.apply_async(("P", "waiting", 0.05))
    wait_for(lambda: coalesce_info(cluster, worker.hostname).get("parked") == 1, timeout=30,
             what="the waiting run parked")  # fmt: skip
    links = [_frozen(app, f"L{i}") for i in range(2)]
    linked = [co.apply_async(("P", f"c{i}"), link=links[i]) for i in range(2)]
    chorded = chord([co.s("P", "h")])(app.tasks[TOTAL].s())
    wait_for(lambda: coalesce_info(cluster, worker.hostname).get("coalesced") == 3, timeout=30,
             what="c0, c1 and the chord part covered")  # fmt: skip
    covered = [*linked, chorded.parent.results[0]]  # the chord's one part

    done = celery(cluster, "purge", "-f", "-Q", cluster.ns)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "Purged 1 parked task from the delay store.", done.stdout

    wait_for(lambda: all(r.state == "REVOKED" for r in covered), timeout=30,
             what="the covered messages revoked")  # fmt: skip
    assert long.get(timeout=60) == "long"
    later = co.apply_async(("P", "later", 0.05))
    assert later.get(timeout=60) == "later"
    wait_for(lambda: chorded.state == "FAILURE", timeout=30, what="the chord failed")
    assert _tags(journal, CO) == ["long", "later"]  # the purged waiting run never ran
    assert [r.state for r in covered] == ["REVOKED"] * 3  # not ended by the next run
    assert AsyncResult(waiting.id, app=app).state == "PENDING"  # no state, as Celery's purge
    assert [AsyncResult(s.id, app=app).state for s in links] == ["PENDING"] * 2
    assert _tags(journal, RECORD) == []  # no callback ran (and the chord's body failed)
    info = coalesce_info(cluster, worker.hostname)
    assert (info["covered_purged"], info["runs"], info["coalesced"]) == (3, 2, 3)
