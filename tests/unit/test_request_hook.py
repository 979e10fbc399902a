"""The request hook: one hooked subclass per request class, and each ending of a request
heard once (by the admission pipeline's *finish*), with its outcome (by the stats)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from billiard.einfo import ExceptionWithTraceback
from celery.exceptions import Retry, TaskRevokedError
from celery.worker.request import Request

from celery_extras.admission.request_hook import HOOK_ATTR, RequestHook, request_hook, retry_in


class TaskRequest(Request):
    """A Celery request without a message whose callbacks note their calls, as Celery's run.

    ``on_success`` hands a failure to ``on_failure``, as Celery's request does;
    ``execute_using_pool`` raises *refused* when set (revoked before the pool).
    """

    def __init__(self, name: str = "t") -> None:
        self.id = f"r{id(self)}"
        self.name = name
        self.calls: list[tuple[str, Any]] = []
        self.refused: BaseException | None = None

    def on_accepted(self, pid: Any, time_accepted: Any) -> Any:
        self.calls.append(("accepted", pid))
        return "accepted"

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        self.calls.append(("success", failed__retval__runtime))
        failed, retval, _ = failed__retval__runtime
        if failed:
            return self.on_failure(retval, return_ok=True)
        return "ok"

    def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("failure", exc_info))
        return "failed"

    def on_timeout(self, soft: bool, timeout: Any) -> Any:
        self.calls.append(("timeout", soft))
        return "timeout"

    def terminate(self, pool: Any, signal: Any = None) -> Any:
        self.calls.append(("terminate", signal))
        return "terminated"

    def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> Any:
        self.calls.append(("cancel", signal))
        return "cancelled"

    def execute_using_pool(self, pool: Any, **kwargs: Any) -> Any:
        self.calls.append(("execute", pool))
        if self.refused is not None:
            raise self.refused
        return "applied"


class OtherRequest(TaskRequest):
    """Another request class (a task's own ``Request``)."""


class Outcomes:
    """An outcome listener noting what it heard, in order, in *events*."""

    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        self.started = lambda request: events.append(("started", request))
        self.succeeded = lambda request, result: events.append(("succeeded", request, result))
        self.failed = lambda request, exc_info: events.append(("failed", request, exc_info))


@pytest.fixture
def ended() -> list[Any]:
    return []


@pytest.fixture
def hook(ended: list[Any]) -> RequestHook:
    hook = RequestHook()
    hook.listen(finish=lambda request, retry_in, outcome: ended.append(request))
    return hook


def test_one_hooked_class_per_request_class(hook: RequestHook) -> None:
    first, second, other = TaskRequest(), TaskRequest(), OtherRequest()
    hook.adopt(first)
    hooked = type(first)
    assert hooked is not TaskRequest and issubclass(hooked, TaskRequest)
    assert hooked.__name__ == "TaskRequest" and hooked.__module__ == TaskRequest.__module__
    hook.adopt(first)  # idempotent
    hook.adopt(second)  # the same class: cached
    assert type(first) is hooked and type(second) is hooked
    hook.adopt(other)
    assert type(other) is not hooked and issubclass(type(other), OtherRequest)
    assert type(other) is not OtherRequest
    again = RequestHook()  # a hooked class adopted again (another hook) stays as it is
    again.adopt(first)
    assert type(first) is hooked
    hook.forget()  # the strategies are rebuilt: a new class for new requests...
    third = TaskRequest()
    hook.adopt(third)
    assert type(third) is not hooked and issubclass(type(third), TaskRequest)
    hook.adopt(first)  # ...while one in flight keeps its own
    assert type(first) is hooked


def succeed(request: Any) -> Any:
    return request.on_success((False, "result", 0.1))


def fail_by_result(request: Any) -> Any:
    return request.on_success((True, "einfo", 0.1))  # the pool's result callback


def fail(request: Any) -> Any:
    return request.on_failure("einfo")  # the pool's error callback


def hard_timeout(request: Any) -> Any:
    return request.on_timeout(False, 10)


def soft_timeout(request: Any) -> Any:
    return request.on_timeout(True, 10)


def terminate_running(request: Any) -> Any:
    request.time_start = 1.0
    return request.terminate("pool", 15)


def terminate_waiting(request: Any) -> Any:
    return request.terminate("pool", 15)  # Celery terminates it when the pool accepts it


def cancel_running(request: Any) -> Any:
    request.time_start = 1.0
    return request.cancel("pool", 15)


def cancel_waiting(request: Any) -> Any:
    return request.cancel("pool", 15)


def revoked_before_the_pool(request: Any) -> Any:
    request.refused = TaskRevokedError("revoked")
    with pytest.raises(TaskRevokedError):
        request.execute_using_pool("pool")
    return "raised"


def refused_by_the_pool(request: Any) -> Any:
    request.refused = ValueError("the pool is closed")
    with pytest.raises(ValueError):
        request.execute_using_pool("pool")
    return "raised"


def reaches_the_pool(request: Any) -> Any:
    return request.execute_using_pool("pool")


def accepted(request: Any) -> Any:
    return request.on_accepted(123, 4.5)


@pytest.mark.parametrize(
    ("ending", "finishes", "returned", "calls"),
    [
        (succeed, 1, "ok", [("success", (False, "result", 0.1))]),
        (fail, 1, "failed", [("failure", "einfo")]),
        (hard_timeout, 1, "timeout", [("timeout", False)]),
        (soft_timeout, 0, "timeout", [("timeout", True)]),
        (terminate_running, 1, "terminated", [("terminate", 15)]),
        (terminate_waiting, 0, "terminated", [("terminate", 15)]),
        (cancel_running, 1, "cancelled", [("cancel", 15)]),
        (cancel_waiting, 0, "cancelled", [("cancel", 15)]),
        (revoked_before_the_pool, 1, "raised", [("execute", "pool")]),
        (refused_by_the_pool, 1, "raised", [("execute", "pool")]),
        (reaches_the_pool, 0, "applied", [("execute", "pool")]),
        (accepted, 0, "accepted", [("accepted", 123)]),
    ],
)
def test_each_ending_finishes_once_and_runs_the_requests_own_callback(
    hook: RequestHook, ended: list[Any], ending: Any, finishes: int, returned: str,
    calls: list[tuple[str, Any]],
) -> None:  # fmt: skip
    request = TaskRequest()
    hook.adopt(request)
    assert ending(request) == returned
    assert ended == [request] * finishes
    assert request.calls == calls


def test_a_failure_reported_through_on_success_reaches_finish_from_both_callbacks(
    hook: RequestHook, ended: list[Any]
) -> None:
    """Celery's ``on_success`` hands a failed result on to ``on_failure``: both are hooked,
    so *finish* is told twice and must be idempotent (the pipeline's is: it hears a request
    once, see test_admission_pipeline)."""
    request = TaskRequest()
    hook.adopt(request)
    assert fail_by_result(request) == "failed"
    assert request.calls == [("success", (True, "einfo", 0.1)), ("failure", "einfo")]
    assert ended == [request, request]


def test_outcomes_hear_started_succeeded_and_failed() -> None:
    events: list[tuple[Any, ...]] = []
    hook = RequestHook()
    hook.listen(outcomes=Outcomes(events))
    request, failing = TaskRequest(), TaskRequest()
    hook.adopt(request)
    hook.adopt(failing)
    request.on_accepted(1, 0.0)
    succeed(request)
    failing.on_accepted(2, 0.0)
    fail(failing)
    failing.on_timeout(False, 1)  # no outcome listener hears a timeout: its on_failure does
    assert events == [("started", request), ("succeeded", request, (False, "result", 0.1)),
                      ("started", failing), ("failed", failing, "einfo")]  # fmt: skip


def test_finish_comes_before_the_outcome_and_each_listener_is_set_alone() -> None:
    events: list[tuple[Any, ...]] = []
    hook = RequestHook()
    hook.listen(finish=lambda request, retry_in, outcome: events.append(("finish", request)),
                outcomes=Outcomes(events))  # fmt: skip
    request = TaskRequest()
    hook.adopt(request)
    succeed(request)
    assert events == [("finish", request), ("succeeded", request, (False, "result", 0.1))]
    events.clear()
    hook.listen(outcomes=None)  # the stats stop listening; finish stays
    fail(request)
    assert events == [("finish", request)]
    events.clear()
    hook.listen(outcomes=Outcomes(events))  # finish left as it is (False: unchanged)
    fail(request)
    assert events == [("finish", request), ("failed", request, "einfo")]


def test_listen_finish_none_stops_finishing(hook: RequestHook, ended: list[Any]) -> None:
    request = TaskRequest()
    hook.adopt(request)  # hooked before the listener goes: the class reads the hook's now
    hook.listen(finish=None)
    for ending in (succeed, fail, hard_timeout, terminate_running, cancel_running,
                   revoked_before_the_pool):  # fmt: skip
        ending(request)
    assert ended == []
    hook.listen(finish=lambda request, retry_in, outcome: ended.append(request))
    succeed(request)
    assert ended == [request]


def test_wrap_hooks_each_request_handed_on_and_unwrap_restores(hook: RequestHook) -> None:
    passed: list[Any] = []
    on_task_request = passed.append
    consumer = SimpleNamespace(on_task_request=on_task_request)
    hook.wrap(consumer)
    wrapped = consumer.on_task_request
    assert wrapped is not on_task_request
    hook.wrap(consumer)  # once
    assert consumer.on_task_request is wrapped
    request = TaskRequest()
    consumer.on_task_request(request)
    assert passed == [request] and type(request) is not TaskRequest
    hook.unwrap(consumer)
    assert consumer.on_task_request is on_task_request
    hook.unwrap(consumer)  # twice: harmless
    assert consumer.on_task_request is on_task_request
    plain = TaskRequest()
    consumer.on_task_request(plain)
    assert passed == [request, plain] and type(plain) is TaskRequest


def test_the_consumer_has_one_hook() -> None:
    consumer = SimpleNamespace()
    hook = request_hook(consumer)
    assert getattr(consumer, HOOK_ATTR) is hook and request_hook(consumer) is hook


class _Einfo:
    def __init__(self, exception: BaseException) -> None:
        self.exception = exception


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: Retry(when=7), 7.0),
        (lambda: Retry(when=None), 0.0),
        (lambda: Retry(when=datetime.now(UTC) + timedelta(seconds=60)), 60.0),
        (lambda: ExceptionWithTraceback(Retry(when=3), "tb"), 3.0),  # as from a pool process
        (lambda: ValueError("no retry"), None),
    ],
)
def test_finish_hears_the_seconds_until_a_retry(
    make: Callable[[], BaseException], expected: Any
) -> None:
    """A run that raised ``Retry`` goes on: *finish* hears when (a coalesced run keeps its
    key for the retry); any other ending hears ``None``."""
    exception = make()
    heard: list[Any] = []
    hook = RequestHook()
    hook.listen(finish=lambda request, retry_in, outcome: heard.append(retry_in))
    by_result, by_failure = TaskRequest(), TaskRequest()
    hook.adopt(by_result)
    hook.adopt(by_failure)
    by_result.on_success((True, _Einfo(exception), 0.1))
    by_failure.on_failure(_Einfo(exception))
    for one in heard:
        if expected is None:
            assert one is None
        else:
            assert one == pytest.approx(expected, abs=1.0)
    assert len(heard) == 3  # on_success hands a failure on to on_failure: heard twice
    assert retry_in(Retry(when=-5)) == 0.0
