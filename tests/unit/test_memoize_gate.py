"""memoize()'s gate through a real admission pipeline with a fake consumer (a worker with no
store: its own table), and what it says at start without a result backend."""

from __future__ import annotations

import logging

import pytest
from celery import Celery

import celery_extras
from celery_extras.admission.pipeline import Pipeline
from celery_extras.admission.registry import TaskPolicies
from celery_extras.memoize.gate import MemoizeGate
from celery_extras.memoize.spec import MemoizeSpec
from tests.support import worker_state as worker_state_support
from tests.support.clock import FakeClock
from tests.support.fake_consumer import Consumer
from tests.unit.test_debounce_gate import Request

SETTINGS = {"memoize_on_store_error": "hold", "store_retry": 1.0, "delay_max_hold": 2.0}


def memoized(backend: str | None) -> tuple[Pipeline, MemoizeGate, Consumer]:
    app = Celery("unit-memoize", broker="memory://", backend=backend, set_as_current=False)
    celery_extras.install(app)
    clock = FakeClock(1000.0)
    gate = MemoizeGate(app, SETTINGS, clock, clock)
    pipeline, consumer = Pipeline([gate]), Consumer()
    assert pipeline.register("t", TaskPolicies(memoize=MemoizeSpec.build("t", 60, None, 2, 30)))
    pipeline.start(consumer)
    return pipeline, gate, consumer


def test_without_a_result_backend_it_says_so_joins_runs_and_keeps_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="celery_extras.memoize"):
        pipeline, gate, c = memoized(None)
    try:
        assert "memoize() needs a result backend: t store no result" in caplog.text
        first, joined, later = Request("x", 1), Request("x", 2), Request("x", 3)
        first.args = joined.args = later.args = ("x",)  # one key: the same arguments
        pipeline.submit(c, first, "t")
        pipeline.submit(c, joined, "t")
        assert c.ran == [first] and (first.acked, joined.acked) == (0, 1)
        first.on_success((False, {"x": 1}, 0.1))  # ends: nothing kept (no backend)
        pipeline.submit(c, later, "t")
        assert c.ran == [first, later]
        info = gate.info()
        assert (info["runs"], info["memoized"], info["holds"]) == (2, 1, "worker")
        assert info["tasks"]["t"] == {"ttl": 60.0, "max_keys": 2, "lease": 30.0,
                                      "key": "arguments", "running": 1, "waiting": 0}  # fmt: skip
    finally:
        pipeline.stop()
        worker_state_support.clear()


def test_with_a_result_backend_a_kept_result_covers_the_next_message() -> None:
    pipeline, gate, c = memoized("cache+memory://")
    try:
        first, hit = Request("x", 1), Request("x", 2)
        first.args = hit.args = ("x",)
        pipeline.submit(c, first, "t")
        first.on_success((False, {"x": 1}, 0.1))
        pipeline.submit(c, hit, "t")
        assert c.ran == [first] and gate.info()["memoized"] == 1
        assert gate.queued() == 1  # ending here with the kept result, then acked
        assert gate.holds.local.kept("t") == 1
    finally:
        pipeline.stop()
        worker_state_support.clear()
