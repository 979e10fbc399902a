"""The counting seams with a fake clock: strategies count receipts, requests their outcomes
(heard through the consumer's request hook)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from celery.concurrency.thread import TaskPool as ThreadPool
from celery.exceptions import (
    Ignore,
    Reject,
    Retry,
    Terminated,
    TimeLimitExceeded,
    WorkerLostError,
)
from celery.worker.request import Request

from celery_extras.admission.request_hook import RequestHook
from celery_extras.stats.outcomes import OutcomeCounter, counting_strategy
from celery_extras.stats.recorder import COUNTERS, LockedRecorder, Recorder
from celery_extras.stats.steps import StatsRecording
from tests.support.clock import FakeClock


class TaskRequest(Request):
    """A request without a message whose callbacks note their calls, as Celery's do.

    ``on_success`` hands a failure to ``on_failure``, as Celery's request does.
    """

    def __init__(self, name: str = "t", acks_late: bool = False, lost_rejects: bool = False):
        self.name = name
        self._task = SimpleNamespace(acks_late=acks_late, reject_on_worker_lost=lost_rejects)
        self.calls: list[tuple[str, Any]] = []

    @property
    def task(self) -> Any:
        return self._task

    def on_accepted(self, pid: Any, time_accepted: Any) -> None:
        self.calls.append(("accepted", (pid, time_accepted)))

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        self.calls.append(("success", failed__retval__runtime))
        failed, retval, _ = failed__retval__runtime
        if failed:
            return self.on_failure(retval, return_ok=True)
        return "ok"

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False):
        self.calls.append(("failure", return_ok))


def einfo(exc: BaseException) -> ExceptionInfo:
    try:
        raise exc
    except BaseException:
        return ExceptionInfo()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder(FakeClock(5000.0))


def counts(recorder: Recorder, name: str = "t") -> dict[str, int]:
    """The non-zero counters of task *name* so far (the bucket being filled included)."""
    figures = recorder.snapshot([60], partial=True)["tasks"].get(name, {})
    return {c: figures[c][0] for c in COUNTERS if figures.get(c, [0])[0]}


def hooked_consumer(recorder: Recorder, on_task_request: Any) -> tuple[RequestHook, Any]:
    """A request hook counting outcomes into *recorder*, and a consumer whose
    ``on_task_request`` (*on_task_request*, wrapped by the hook) hooks each request."""
    hook = RequestHook()
    hook.listen(outcomes=OutcomeCounter(recorder))
    consumer = SimpleNamespace(on_task_request=on_task_request)
    hook.wrap(consumer)
    return hook, consumer


def handed(recorder: Recorder, request: TaskRequest) -> TaskRequest:
    """*request* after the counting ``on_task_request``, which passes it on unchanged."""
    passed: list[Any] = []
    _hook, consumer = hooked_consumer(recorder, passed.append)
    consumer.on_task_request(request)
    assert passed == [request]
    return request


def test_a_strategy_counts_each_message_as_received_before_handling_it(
    recorder: Recorder,
) -> None:
    seen: list[tuple[Any, ...]] = []

    def strategy(*args: Any, **kwargs: Any) -> str:
        seen.append((*args, kwargs))
        raise ValueError("revoked, malformed...: counted all the same")

    counting = counting_strategy("t", strategy, recorder)
    message = SimpleNamespace(headers={"task": "t"})
    for _ in range(3):
        with pytest.raises(ValueError):
            counting(message, "body", "ack", "reject", "callbacks", extra=1)
    assert seen == [(message, "body", "ack", "reject", "callbacks", {"extra": 1})] * 3
    assert counts(recorder) == {"received": 3}


def test_a_shadow_name_is_counted_as_the_request_will_be(recorder: Recorder) -> None:
    counting = counting_strategy("t", lambda *a: None, recorder)
    counting(SimpleNamespace(headers={"task": "t", "shadow": "t.shadow"}), None, None, None, None)
    counting(SimpleNamespace(headers={"task": "t", "shadow": None}), None, None, None, None)
    assert counts(recorder, "t.shadow") == {"received": 1}
    assert set(recorder.names()) == {"t", "t.shadow"}


def test_a_request_counts_start_success_and_runtime_then_calls_its_own_callbacks(
    recorder: Recorder,
) -> None:
    request = handed(recorder, TaskRequest())
    assert isinstance(request, TaskRequest) and type(request) is not TaskRequest
    request.on_accepted(123, 4.5)
    assert request.on_success((False, "result", 0.25)) == "ok"
    assert request.calls == [("accepted", (123, 4.5)), ("success", (False, "result", 0.25))]
    assert counts(recorder) == {"started": 1, "succeeded": 1}
    runtime = recorder.snapshot([60], partial=True)["tasks"]["t"]["runtime"]
    assert (runtime["count"], runtime["sum"]) == (1, 0.25)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ValueError("boom"), {"failed": 1}),
        (Retry(), {"retried": 1}),
        # retry(exc=...), autoretry_for and retry_policy: a Retry carrying the error
        (Retry("again", exc=ValueError("boom"), when=1.0), {"retried": 1}),
        (Retry(exc=Reject("inner")), {"retried": 1}),
        (Reject(), {"rejected": 1}),
        (Ignore(), {"ignored": 1}),
        (TimeLimitExceeded(1.0), {"failed": 1}),
        (SystemExit(1), {"failed": 1}),  # a child gone without a terminate: lost worker
        (Terminated(15), {}),  # counted as revoked, by task_revoked
    ],
)
def test_a_failure_is_counted_once_whichever_callback_reports_it(
    recorder: Recorder, exc: BaseException, expected: dict[str, int]
) -> None:
    by_result = handed(recorder, TaskRequest("by-result"))
    by_result.on_success((True, einfo(exc), 0.1))  # the pool's result callback
    assert by_result.calls == [("success", (True, by_result.calls[0][1][1], 0.1)),
                               ("failure", True)]  # fmt: skip
    by_error = handed(recorder, TaskRequest("by-error"))
    by_error.on_failure(einfo(exc))  # the pool's error callback
    assert by_error.calls == [("failure", False)]
    assert counts(recorder, "by-result") == expected
    assert counts(recorder, "by-error") == expected


def test_an_exception_wrapped_by_billiard_is_unwrapped_once(recorder: Recorder) -> None:
    request = handed(recorder, TaskRequest())
    wrapped = einfo(ValueError("x"))
    wrapped.exception = ExceptionWithTraceback(Retry(exc=ValueError("inner")), "tb")
    request.on_failure(wrapped)
    assert counts(recorder) == {"retried": 1}


def test_a_child_killed_by_a_terminate_is_not_counted_again(recorder: Recorder) -> None:
    request = handed(recorder, TaskRequest())
    request._already_revoked = True
    request.on_failure(einfo(SystemExit(15)))
    assert counts(recorder) == {}


def test_a_hard_time_limit_with_acks_late_and_no_ack_on_timeout_is_requeued(
    recorder: Recorder,
) -> None:
    request = handed(recorder, TaskRequest(acks_late=True))
    request.task.acks_on_timeout = False
    request.on_failure(einfo(TimeLimitExceeded(1.0)))
    assert counts(recorder) == {"rejected": 1}


def test_a_message_republished_by_celery_extras_is_not_received_again(
    recorder: Recorder,
) -> None:
    counting = counting_strategy("t", lambda *args, **kw: None, recorder)
    for headers in ({"task": "t"}, {"task": "t", "extras_slot": "t"}, {"extras_parked": "1"}):
        counting(SimpleNamespace(headers=headers), None, None, None, None)
    assert counts(recorder) == {"received": 1}


@pytest.mark.parametrize(
    ("acks_late", "lost_rejects", "expected"),
    [(True, True, {"rejected": 1}), (True, False, {"failed": 1}), (False, False, {"failed": 1})],
)
def test_a_lost_worker_counts_as_celery_treats_it(
    recorder: Recorder, acks_late: bool, lost_rejects: bool, expected: dict[str, int]
) -> None:
    request = handed(recorder, TaskRequest(acks_late=acks_late, lost_rejects=lost_rejects))
    request.on_failure(einfo(WorkerLostError("killed")))
    assert counts(recorder) == expected


def test_a_request_handed_over_twice_counts_once(recorder: Recorder) -> None:
    hook, consumer = hooked_consumer(recorder, lambda request: None)
    on_task_request = consumer.on_task_request
    request = TaskRequest()
    on_task_request(request)
    counted_class = type(request)
    on_task_request(request)
    assert type(request) is counted_class
    request.on_accepted(1, 0.0)
    request.on_success((False, None, 0.1))
    assert counts(recorder) == {"started": 1, "succeeded": 1}
    on_task_request(TaskRequest())  # one counting class per request class
    hook.forget()
    other = TaskRequest()
    on_task_request(other)
    assert type(other) is not counted_class  # made anew after the strategies are rebuilt
    on_task_request(request)  # in flight across the rebuild: still counted once
    assert type(request) is counted_class
    request.on_accepted(2, 0.0)
    assert counts(recorder) == {"started": 2, "succeeded": 1}


def test_a_request_class_that_cannot_be_swapped_is_passed_on_uncounted(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    class Slotted:
        __slots__ = ("name",)

        def on_accepted(self, pid: Any, time_accepted: Any) -> None: ...
        def on_success(self, result: Any, **kwargs: Any) -> None: ...
        def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> None: ...

    class Wider(Slotted):
        __slots__ = ("extra",)

    passed: list[Any] = []
    hook, consumer = hooked_consumer(recorder, passed.append)
    on_task_request = consumer.on_task_request
    hook._classes[Wider] = Slotted  # a layout __class__ cannot change to
    request = Wider()
    on_task_request(request)
    on_task_request(request)
    assert passed == [request, request] and type(request) is Wider
    assert caplog.text.count("cannot hook requests of class") == 1


@pytest.mark.parametrize(
    ("use_eventloop", "pool", "locked"),
    [
        (True, object(), False),  # prefork on the event loop: callbacks on the loop's thread
        (True, ThreadPool.__new__(ThreadPool), True),  # threads: callbacks on pool threads
        (False, object(), True),  # no event loop (gevent, eventlet, ...)
    ],
)
def test_the_recorder_is_locked_when_callbacks_may_come_from_other_threads(
    use_eventloop: bool, pool: Any, locked: bool
) -> None:
    worker = SimpleNamespace(use_eventloop=use_eventloop, pool=pool)
    step = StatsRecording.__new__(StatsRecording)
    step.max_tasks = 10
    step.create(worker)
    assert isinstance(worker.extras_stats, LockedRecorder) is locked
    assert isinstance(worker.extras_stats, Recorder)
