"""A batch's calls end in slices between turns of the worker's loop (issue 51), each call
acked after its result, on a fake consumer whose timer entries the test runs by hand."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_extras import batch, install
from celery_extras.admission.gate import Ticket
from celery_extras.batch import gate as gate_module
from celery_extras.batch.gate import NEXT_SLICE, BatchGate
from celery_extras.batch.table import Batch
from tests.support.fake_consumer import Consumer


class Request:
    """A worker request as the batch gate ends it: acking it records what was stored."""

    def __init__(self, task: Any, index: int, acks: list[tuple[str, str]]) -> None:
        self.id, self.task, self.name = f"call-{index}", task, task.name
        self.args, self.kwargs, self.delivery_info = [index], {}, {}
        self.hostname = "w1@host"
        self.request_dict = {"id": self.id, "task": task.name, "args": [index], "kwargs": {}}
        self._acks = acks

    def acknowledge(self) -> None:
        self._acks.append((self.id, self.task.AsyncResult(self.id).state))

    def send_event(self, *args: Any, **kwargs: Any) -> None:
        pass


class Pipeline:
    """Records which calls the gate said ended, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def ended(self, ticket: Ticket, *args: Any) -> None:
        self.calls.append(ticket.request.id)


def test_a_batch_ends_a_slice_per_turn_each_call_acked_after_its_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = install(Celery("batch-slices", backend="cache+memory://", set_as_current=True))

    @batch(size=10, wait=1.0)
    @app.task(name="u.sliced", shared=False)
    def sliced(calls: list[Any]) -> list[int]:
        return [c.args[0] for c in calls]

    monkeypatch.setattr(gate_module, "SLICE", 3)
    consumer, pipeline, acks = Consumer(), Pipeline(), list[tuple[str, str]]()
    gate = BatchGate(app, {})
    gate.start(pipeline, consumer)
    task = app.tasks["u.sliced"]
    tickets = [Ticket(Request(task, i, acks), task.name, consumer) for i in range(7)]
    gate.running["batch-1"] = list(tickets)
    gate._end("batch-1", ("success", [10 * i for i in range(7)]))
    turns = [len(acks)]
    while consumer.scheduled:
        seconds, fn, args = consumer.scheduled.pop(0)
        assert seconds == NEXT_SLICE > 0.0  # after the loop's next poll, not in this turn
        assert gate.queued() == 7 - len(acks) and gate.running
        fn(*args)
        turns.append(len(acks))
    assert turns == [3, 6, 7] and not gate.running
    assert acks == [(f"call-{i}", "SUCCESS") for i in range(7)]  # each acked after its result
    assert [task.AsyncResult(f"call-{i}").get(timeout=1) for i in range(7)] == [
        10 * i for i in range(7)
    ]
    assert pipeline.calls == [f"call-{i}" for i in range(7)]
    assert gate.counts["succeeded"] == 7


class Pool:
    """Records the jobs handed to it."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, tuple[Any, ...]]] = []

    def apply_async(self, fn: Any, args: tuple[Any, ...] = (), **options: Any) -> None:
        self.jobs.append((fn, args))


def test_a_batchs_calls_are_made_a_slice_per_turn_then_handed_to_the_pool_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 51: making 10,000 calls for the pool in one go kept the loop from pings as
    ending them did; they are made in slices too, and the pool gets one job of all."""
    app = install(Celery("batch-packs", set_as_current=True))

    @batch(size=10, wait=1.0)
    @app.task(name="u.packed", shared=False)
    def packed(calls: list[Any]) -> None:
        return None

    monkeypatch.setattr(gate_module, "SLICE", 3)
    consumer, pool = Consumer(), Pool()
    consumer.pool = pool  # type: ignore[attr-defined]
    gate = BatchGate(app, {})
    gate.start(Pipeline(), consumer)
    task = app.tasks["u.packed"]
    tickets = [Ticket(Request(task, i, []), task.name, consumer) for i in range(7)]
    gate._run(Batch(("u.packed", None), 0.0, 1.0, tickets))
    turns = 0
    while consumer.scheduled:
        assert not pool.jobs
        seconds, fn, args = consumer.scheduled.pop(0)
        assert seconds == NEXT_SLICE
        fn(*args)
        turns += 1
    assert turns == 2 and len(pool.jobs) == 1
    (_, (name, calls, request)) = pool.jobs[0]
    assert name == "u.packed" and [c["id"] for c in calls] == [f"call-{i}" for i in range(7)]
    assert calls[0]["args"] == [0] and calls[0]["hostname"] == "w1@host"
    assert request["id"].startswith("batch-") and gate.queued() == 7
