"""The example project's own tasks, tested with celery-extras' pytest plugin on simulated
time: seconds of limits and retries in a fraction of a second of test time.

Run with ``pytest example_project/tests`` (``pip install 'celery-extras[testing]'``).
"""

from __future__ import annotations

from typing import Any

from celery_extras import SimulatedClock
from example_project.demos.coalesce import reindex
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
