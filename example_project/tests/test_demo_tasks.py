"""The example project's own tasks, tested with celery-extras' pytest plugin on simulated
time: seconds of limits, retries and ETAs in a fraction of a second of test time (the
concurrency cap, which holds tasks while others run, in real time).

Run with ``pytest example_project/tests`` (``pip install 'celery-extras[testing]'``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from celery import Celery

from celery_extras import SimulatedClock, delayed
from example_project.demos.coalesce import reindex
from example_project.demos.concurrency import export, most_at_once
from example_project.demos.herd import journal_key, read_journal, remind
from example_project.demos.policies import flaky, limited


def ready(results: list[Any]) -> int:
    return sum(r.ready() for r in results)


def test_limited_runs_ten_a_second(extras_worker: Any, extras_clock: SimulatedClock) -> None:
    results = [limited.delay(i) for i in range(21)]
    extras_clock.advance(0)
    assert ready(results) == 1
    for tenth in range(1, 21):
        extras_clock.advance(0.1)
        assert ready(results) == 1 + tenth
    assert ready(results) == 21


def test_flaky_is_retried_after_its_backoff(
    extras_worker: Any, extras_clock: SimulatedClock
) -> None:
    result = flaky.delay("acct-1")
    extras_clock.advance(0.3499)  # retries wait 0.05, 0.1 and 0.2 s: the third at 0.35 s
    assert not result.ready()
    extras_clock.advance(0.0001)
    assert result.get(timeout=10) == 3


def test_reindex_triggers_coalesce(extras_worker: Any, extras_clock: SimulatedClock) -> None:
    results = [reindex.delay("acct-7", 0.0) for _ in range(10)]
    extras_clock.advance(0)
    runs = {r.get(timeout=10)["run"] for r in results}
    assert runs == {results[0].id}  # one run covered all ten


def test_a_herd_is_parked_then_runs_once_at_its_eta(
    extras_app: Celery, extras_worker: Any, extras_clock: SimulatedClock
) -> None:
    journal = journal_key(extras_app, "test")  # under the test store's namespace: cleaned up
    eta = extras_clock.wall() + 10
    for _ in range(100):
        remind.apply_async((journal,), eta=datetime.fromtimestamp(eta, UTC))
    extras_clock.advance(0)  # the worker takes them all: each is parked
    listing = delayed(extras_app)
    assert listing["depth"] == 100
    assert listing["tasks"][remind.name]["parked"] == 100
    extras_clock.advance(9.999)
    assert read_journal(extras_app, journal) == []
    extras_clock.advance(0.001)
    runs = read_journal(extras_app, journal)
    assert len({task_id for task_id, _ in runs}) == 100
    assert {started for _, started in runs} == {eta}  # all at the ETA, none before
    extras_clock.advance(3600)  # and once only
    assert len(read_journal(extras_app, journal)) == 100
    assert delayed(extras_app)["depth"] == 0


def test_export_never_runs_more_than_two_at_once(extras_worker: Any) -> None:
    runs = [r.get(timeout=10) for r in [export.delay(i, 0.2) for i in range(6)]]
    assert sorted(r["report"] for r in runs) == list(range(6))
    assert most_at_once(runs) == 2  # a pool of 4 threads, capped at 2
