"""Batching's pure parts on a fake clock, and the pool job run in this process: which calls
a batch takes and when, a batch's arguments checked by name, and how a batch ends."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_extras import Call, PolicyError, batch, install
from celery_extras.batch.runner import BatchResultError, exception_of, read_ending, run_batch
from celery_extras.batch.spec import BatchSpec
from celery_extras.batch.table import BatchTable
from tests.support.clock import FakeClock


def test_a_batch_is_due_when_full_or_its_wait_after_the_first_call() -> None:
    clock = FakeClock()
    table: BatchTable[str] = BatchTable(clock)
    assert table.add("a", "a1", size=3, wait=1.0) is None
    clock.now += 0.4
    assert table.add("b", "b1", size=3, wait=1.0) is None
    assert table.add("a", "a2", size=3, wait=1.0) is None
    full = table.add("a", "a3", size=3, wait=1.0)
    assert full is not None and full.items == ["a1", "a2", "a3"]
    assert table.waiting() == 1 and table.next_due() == pytest.approx(1001.4)
    clock.now += 0.3
    assert table.add("a", "a4", size=3, wait=1.0) is None  # opens a new batch of "a"
    clock.now += 0.699_999  # 1 us short of b's wait
    assert table.take_due() == []
    clock.now += 0.000_001
    assert [b.items for b in table.take_due()] == [["b1"]]
    clock.now += 0.3
    assert [b.items for b in table.take_due()] == [["a4"]]
    assert table.waiting() == 0 and table.next_due() is None


def test_a_batch_of_size_one_is_due_at_once_and_stop_takes_every_open_batch() -> None:
    table: BatchTable[int] = BatchTable(FakeClock())
    assert table.add("x", 1, size=1, wait=60.0) is not None
    table.add("y", 2, size=5, wait=60.0)
    table.add("z", 3, size=5, wait=60.0)
    assert sorted(i for b in table.take_all() for i in b.items) == [2, 3] and not table.open


@pytest.mark.parametrize(
    ("size", "wait", "key", "error"),
    [(0, 1.0, None, "size 0: expected an int from 1 to 10000"),
     (10_001, 1.0, None, "size 10001"), (True, 1.0, None, "size True"),
     (5, -1, None, "wait -1: expected seconds from 0 to 3600"),
     (5, float("nan"), None, "wait nan"), (5, 3601, None, "wait 3601"),
     (5, 1.0, "host", "key 'host': expected a callable")],
)  # fmt: skip
def test_bad_arguments_are_refused_naming_the_task_and_the_argument(
    size: Any, wait: Any, key: Any, error: str
) -> None:
    with pytest.raises(PolicyError, match=rf"^batch\(\) on task 't.x': {error}"):
        BatchSpec.build("t.x", size, wait, key)


@pytest.fixture
def app() -> Celery:
    return install(Celery("batch-unit", set_as_current=True))


def calls(*tags: Any) -> list[dict[str, Any]]:
    return [{"id": f"id-{t}", "args": [t], "kwargs": {}, "headers": {"retries": 0}}
            for t in tags]  # fmt: skip


REQUEST = {"id": "batch-1", "retries": 0, "delivery_info": {}}


def test_the_pool_job_calls_the_task_once_with_every_call(app: Celery) -> None:
    seen: list[list[Call]] = []

    @batch(size=10, wait=1.0)
    @app.task(name="u.ok", shared=False)
    def ok(batch_calls: list[Call]) -> list[int]:
        seen.append(batch_calls)
        return [c.args[0] + 1 for c in batch_calls]

    assert run_batch("u.ok", calls(1, 2, 3), REQUEST) == ("success", [2, 3, 4], {})
    assert seen == [[Call("id-1", (1,), {}, {"retries": 0}), Call("id-2", (2,), {}, {"retries": 0}),
                     Call("id-3", (3,), {}, {"retries": 0})]]  # fmt: skip


def test_none_is_a_result_of_none_per_call_and_a_wrong_length_fails_the_batch(
    app: Celery,
) -> None:
    @app.task(name="u.none", shared=False)
    def nothing(batch_calls: list[Call]) -> None:
        return None

    @app.task(name="u.short", shared=False)
    def short(batch_calls: list[Call]) -> list[int]:
        return [1]

    assert run_batch("u.none", calls(1, 2), REQUEST) == ("success", [None, None], {})
    kind, stored, _ = run_batch("u.short", calls(1, 2, 3), REQUEST)
    exc = exception_of(app, stored)
    assert kind == "failure" and type(exc).__name__ == BatchResultError.__name__
    assert str(exc).startswith("batch task u.short returned 1 results for 3 calls")


def test_an_exception_fails_the_batch_and_self_retry_retries_it_without_publishing(
    app: Celery,
) -> None:
    @app.task(name="u.boom", shared=False)
    def boom(batch_calls: list[Call]) -> list[int]:
        raise KeyError("boom")

    @batch(size=10, wait=1.0)
    @app.task(name="u.again", bind=True, shared=False, max_retries=2)
    def again(self: Any, batch_calls: list[Call]) -> list[int]:
        raise self.retry(countdown=5, exc=ValueError("later"))

    kind, stored, text = run_batch("u.boom", calls(1), REQUEST)
    exc = exception_of(app, stored)
    assert kind == "failure" and isinstance(exc, KeyError) and "KeyError: 'boom'" in text
    kind, when, reason, limit = run_batch("u.again", calls(1, 2), REQUEST)
    assert (kind, when, limit) == ("retry", 5, None)
    assert repr(exception_of(app, reason)) == "ValueError('later')"  # JSON across the pool
    assert app.tasks["u.again"].request.id is None  # the batch's request is popped


def test_an_unknown_task_is_a_failure_not_a_crash(app: Celery) -> None:
    kind, stored, _ = run_batch("u.missing", calls(1), REQUEST)
    assert kind == "failure" and "u.missing" in repr(exception_of(app, stored))


def test_apply_and_eager_mode_run_the_task_as_a_batch_of_the_one_call(app: Celery) -> None:
    """Issue 51: ``apply()`` and ``task_always_eager`` call the task with one ``Call`` and
    give that call its item (the rest of its chain too); a wrong length fails it."""
    seen: list[list[Call]] = []

    @batch(size=10, wait=1.0)
    @app.task(name="u.eager", shared=False)
    def eager(batch_calls: list[Call]) -> list[int]:
        seen.append(batch_calls)
        return [c.args[0] * 2 + c.kwargs.get("plus", 0) for c in batch_calls]

    @batch(size=10, wait=1.0)
    @app.task(name="u.eager_short", shared=False)
    def eager_short(batch_calls: list[Call]) -> list[int]:
        return []

    @app.task(name="u.plus_one", shared=False)
    def plus_one(value: int) -> int:
        return value + 1

    @batch(size=10, wait=1.0)
    @app.task(name="u.eager_retry", bind=True, shared=False, max_retries=3)
    def eager_retry(self: Any, batch_calls: list[Call]) -> list[Any]:
        if self.request.retries < 2:
            raise self.retry(countdown=0)
        return [(c.args[0], c.headers["retries"]) for c in batch_calls]

    applied = eager.apply(args=(1,), kwargs={"plus": 1})
    assert (applied.get(), applied.state) == (3, "SUCCESS")
    (one,) = seen[-1]
    assert (one.id, one.args, one.kwargs) == (applied.id, (1,), {"plus": 1})
    app.conf.task_always_eager = True
    assert eager.delay(5).get() == 10
    assert (eager.s(4) | plus_one.s()).delay().get() == 9
    with pytest.raises(BatchResultError, match="returned 0 results for 1 calls"):
        eager_short.delay(1).get()
    assert [len(calls) for calls in seen] == [1, 1, 1]
    assert eager_retry.delay(7).get() == (7, 2)  # retried eagerly, as Celery does


def test_a_batch_sends_prerun_and_postrun_once_with_its_request_and_is_the_current_task(
    app: Celery,
) -> None:
    """Issue 51: as celery-batches, ``task_prerun``/``task_postrun`` once per batch, the
    batch's request as the task's; ``current_task`` the task in its body, then popped."""
    from celery import current_task, signals

    sent: list[tuple[str, Any, Any, Any]] = []
    current: list[Any] = []

    @batch(size=10, wait=1.0)
    @app.task(name="u.traced", bind=True, shared=False)
    def traced(self: Any, batch_calls: list[Call]) -> list[int]:
        current.append((current_task.name, self.request.id, self.request.called_directly))
        return [c.args[0] for c in batch_calls]

    def prerun(task: Any = None, task_id: Any = None, args: Any = None, **_: Any) -> None:
        sent.append(("prerun", task_id, task.request.id, (len(args[0]), current_task.name)))

    def postrun(task: Any = None, task_id: Any = None, state: Any = None, **_: Any) -> None:
        sent.append(("postrun", task_id, task.request.id, state))

    signals.task_prerun.connect(prerun, sender=traced, weak=False)
    signals.task_postrun.connect(postrun, sender=traced, weak=False)
    try:
        assert run_batch("u.traced", calls(1, 2), REQUEST) == ("success", [1, 2], {})
    finally:
        signals.task_prerun.disconnect(prerun, sender=traced)
        signals.task_postrun.disconnect(postrun, sender=traced)
    assert sent == [("prerun", "batch-1", "batch-1", (2, "u.traced")),
                    ("postrun", "batch-1", "batch-1", "SUCCESS")]  # fmt: skip
    assert current == [("u.traced", "batch-1", False)]
    assert not current_task and traced.request.id is None


def test_an_exception_item_fails_its_call_alone_and_a_call_retry_retries_it_alone(
    app: Celery,
) -> None:
    """Issue 51: per-call outcomes: ``[1, ValueError(), 3, Call.retry(...), 5]`` ends the
    batch as a success whose second call fails and fourth is retried, each on its own."""

    @batch(size=10, wait=1.0)
    @app.task(name="u.mixed", shared=False)
    def mixed(batch_calls: list[Call]) -> list[Any]:
        return [1, ValueError("bad doc"), 3, Call.retry(countdown=2, exc=KeyError("busy"),
                                                         max_retries=4), 5]  # fmt: skip

    kind, results, own = run_batch("u.mixed", calls(1, 2, 3, 4, 5), REQUEST)
    assert (kind, results, sorted(own)) == ("success", [1, None, 3, None, 5], [1, 3])
    failure, stored, text = own[1]
    assert failure == "failure" and repr(exception_of(app, stored)) == "ValueError('bad doc')"
    assert text == "ValueError: bad doc\n"
    retry, when, reason, limit = own[3]
    assert (retry, when, limit) == ("retry", 2, 4)
    assert repr(exception_of(app, reason)) == "KeyError('busy')"
    read = read_ending(app, ("success", results, own))
    assert isinstance(read[2][1][1], ValueError) and isinstance(read[2][3][2], KeyError)


def test_eager_per_call_outcomes_fail_or_retry_the_call(app: Celery) -> None:
    @batch(size=10, wait=1.0)
    @app.task(name="u.eager_own", bind=True, shared=False, max_retries=3)
    def eager_own(self: Any, batch_calls: list[Call]) -> list[Any]:
        (call,) = batch_calls
        if call.args[0] == "bad":
            return [ValueError("bad doc")]
        if call.retries < 2:
            return [Call.retry(countdown=0)]
        return [(call.args[0], call.retries)]

    failed = eager_own.apply(args=("bad",))
    assert failed.state == "FAILURE" and repr(failed.result) == "ValueError('bad doc')"
    assert eager_own.apply(args=("ok",)).get() == ("ok", 2)


def test_a_call_carries_the_request_fields_of_celery_batches_simple_request(
    app: Celery,
) -> None:
    seen: list[Call] = []

    @batch(size=10, wait=1.0)
    @app.task(name="u.fields", shared=False)
    def fields(batch_calls: list[Call]) -> None:
        seen.extend(batch_calls)

    one = dict(calls(1)[0], name="u.fields", delivery_info={"routing_key": "q"}, hostname="w@h",
               reply_to="r-1", correlation_id="id-1", retries=2, eta=None, expires=None,
               ignore_result=False)  # fmt: skip
    assert run_batch("u.fields", [one], REQUEST) == ("success", [None], {})
    (call,) = seen
    got = (call.name, call.delivery_info, call.hostname, call.reply_to, call.correlation_id)
    assert got == ("u.fields", {"routing_key": "q"}, "w@h", "r-1", "id-1") and call.retries == 2
    assert call.request_dict["task"] == "u.fields" and call.request_dict["args"] == [1]
    applied = fields.apply(args=(7,), task_id="e-1")
    assert seen[-1].id == "e-1" and seen[-1].name == "u.fields" and applied.get() is None


def test_an_eager_group_of_batched_calls_runs_as_one_batch(app: Celery) -> None:
    """Issue 51: an eager group of one batched task's calls is one batch; each member
    still ends on its own (its item, an exception item failing it alone); a group of
    other tasks, or with arguments passed on, stays as Celery runs it."""
    from celery import group

    sizes: list[int] = []

    @batch(size=10, wait=1.0)
    @app.task(name="u.grouped", shared=False)
    def grouped(batch_calls: list[Call]) -> list[Any]:
        sizes.append(len(batch_calls))
        return [ValueError("bad") if c.args[0] == 1 else c.args[0] * 10 for c in batch_calls]

    @app.task(name="u.plain_member", shared=False)
    def plain_member(value: int) -> int:
        return value

    app.conf.task_always_eager = True
    result = group(grouped.s(i) for i in range(3)).delay()
    assert sizes == [3]
    assert [r.state for r in result.results] == ["SUCCESS", "FAILURE", "SUCCESS"]
    assert result.get(propagate=False)[::2] == [0, 20]
    assert group(grouped.s(2), grouped.s(3)).apply().get() == [20, 30] and sizes == [3, 2]
    assert group(grouped.s(2), plain_member.s(3)).apply().get() == [20, 3]
    assert sizes == [3, 2, 1]
    assert grouped.apply(args=(4,)).get() == 40 and sizes == [3, 2, 1, 1]
