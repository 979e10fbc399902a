"""The one request hook: every ending of a request on its way to the pool, heard once.

A request handed to the pool gets a subclass of its own class whose callbacks tell
the hook how it went before Celery's own run: ``on_accepted`` (started),
``on_success`` / ``on_failure`` (ended, with the outcome), a hard ``on_timeout``,
``terminate`` and ``cancel`` of a running request, and an ``execute_using_pool``
that raised (revoked before the pool). Swapping the class allocates nothing per
request, and any ``Task.Request`` class keeps its behaviour. One subclass per request
class, whatever listens: the stats count outcomes, the admission pipeline lets the
next request in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from celery.exceptions import Retry, TaskRevokedError
from celery.worker.request import Request

__all__ = ["SUCCEEDED", "OutcomeListener", "RequestHook", "request_hook", "retry_in"]

logger = logging.getLogger(__name__)

#: Attribute of the consumer holding its :class:`RequestHook`.
HOOK_ATTR = "extras_request_hook"
#: Class attribute marking a hooked request class.
_HOOKED = "_extras_hooked"


class OutcomeListener(Protocol):
    """What the stats hear: a request started, succeeded (with its ``(failed, retval,
    runtime)``) or failed (with its ``exc_info``)."""

    started: Callable[[Any], None]
    succeeded: Callable[[Any, Any], None]
    failed: Callable[[Any, Any], None]


def _nothing(*args: Any) -> None:
    pass


#: *finish*'s *outcome* for a request that returned (a failure is its exception; ``None``:
#: the main process does not know, as for a killed or revoked one)
SUCCEEDED = True


def retry_in(exc: Any) -> float | None:
    """The seconds until the retry when *exc* is Celery's ``Retry`` (as a pool process sends
    it back, maybe wrapped in billiard's ``ExceptionWithTraceback``), else ``None``."""
    exc = getattr(exc, "exc", exc) if not isinstance(exc, Retry) else exc
    if not isinstance(exc, Retry):
        return None
    when = exc.when
    if isinstance(when, datetime):
        now = datetime.now(when.tzinfo or UTC) if when.tzinfo else datetime.now()
        return max((when - now).total_seconds(), 0.0)
    return max(float(when), 0.0) if isinstance(when, int | float) else 0.0


def _retry_of_result(failed__retval__runtime: Any) -> float | None:
    try:
        failed, retval, _ = failed__retval__runtime
    except (TypeError, ValueError):
        return None
    return retry_in(getattr(retval, "exception", None)) if failed else None


def _outcome_of_result(failed__retval__runtime: Any) -> Any:
    """:data:`SUCCEEDED`, or the exception of a failure reported through ``on_success``."""
    try:
        failed, retval, _ = failed__retval__runtime
    except (TypeError, ValueError):
        return None
    return _exception(retval) if failed else SUCCEEDED


def _exception(exc_info: Any) -> BaseException | None:
    exc = getattr(exc_info, "exception", None)
    exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback
    return exc if isinstance(exc, BaseException) else None


#: :meth:`RequestHook.listen`'s "leave this listener as it is"
_KEEP: Any = object()


class RequestHook:
    """Hooks requests of one consumer; *finish* and *outcomes* are set by who listens."""

    def __init__(self) -> None:
        self._classes: dict[type[Request], type[Request]] = {}
        self._finish: Callable[[Any, float | None, Any], None] | None = None
        self._outcomes: OutcomeListener | None = None
        self._wrapped: Callable[[Any], Any] | None = None
        # what the hooked classes call, rebound as listeners come and go
        self.started: Callable[[Any], None] = _nothing
        self.succeeded: Callable[[Any, Any], None] = _nothing
        self.failed: Callable[[Any, Any], None] = _nothing
        self.ended: Callable[[Any], None] = _nothing
        # issue 54 (per-queue concurrency): asked first by the consumer's on_task_request;
        # True when it took the request (concurrency/queue_gate.py's QueueSlotGate.divert)
        self.divert: Callable[[Any], bool] | None = None

    # -- listeners -----------------------------------------------------------------------------

    def listen(self, *, finish: Any = _KEEP, outcomes: Any = _KEEP) -> None:
        """Set (or with ``None`` clear) the admission pipeline's *finish*
        (``finish(request, retry_in, outcome)``: *retry_in* as :func:`retry_in` says,
        *outcome* :data:`SUCCEEDED`, the exception, or ``None``) and the stats' *outcomes*
        (an :class:`OutcomeListener`); one not given stays as it is."""
        if finish is not _KEEP:
            self._finish = finish
        if outcomes is not _KEEP:
            self._outcomes = outcomes
        self._rebind()

    def _rebind(self) -> None:
        finish, outcomes = self._finish, self._outcomes
        self.ended = (lambda request: finish(request, None, None)) if finish else _nothing
        self.started = outcomes.started if outcomes else _nothing
        if finish is None:
            self.succeeded = outcomes.succeeded if outcomes else _nothing
            self.failed = outcomes.failed if outcomes else _nothing
            return
        count_success = outcomes.succeeded if outcomes else _nothing
        count_failure = outcomes.failed if outcomes else _nothing

        def succeeded(request: Any, result: Any) -> None:
            # the next starts while Celery acks
            finish(request, _retry_of_result(result), _outcome_of_result(result))
            count_success(request, result)

        def failed(request: Any, exc_info: Any) -> None:
            finish(request, retry_in(getattr(exc_info, "exception", None)), _exception(exc_info))
            count_failure(request, exc_info)

        self.succeeded, self.failed = succeeded, failed

    # -- requests ------------------------------------------------------------------------------

    def adopt(self, request: Any) -> None:
        """Give *request* the hooked subclass of its class (idempotent)."""
        cls = request.__class__
        hooked = self._classes.get(cls)
        if hooked is None:
            hooked = cls if cls.__dict__.get(_HOOKED) else _hooked_class(cls, self)
            self._classes[cls] = self._classes[hooked] = hooked
        if hooked is cls:
            return
        try:
            request.__class__ = hooked
        except TypeError:  # a request class whose layout forbids it: not heard
            logger.warning("celery-extras: cannot hook requests of class %r", cls, exc_info=True)
            self._classes[cls] = cls

    def forget(self) -> None:
        """The consumer rebuilds its strategies (and their request classes)."""
        self._classes.clear()

    def wrap(self, consumer: Any) -> None:
        """Hook every request the consumer hands to the pool (its ``on_task_request``)."""
        if self._wrapped is not None:
            return
        on_task_request = self._wrapped = consumer.on_task_request
        adopt = self.adopt

        def hooked_task_request(request: Any) -> Any:
            adopt(request)
            if self.divert is not None and self.divert(request):  # issue 54: a capped queue
                return None
            return on_task_request(request)

        consumer.on_task_request = hooked_task_request

    def unwrap(self, consumer: Any) -> None:
        if self._wrapped is not None:
            consumer.on_task_request = self._wrapped
            self._wrapped = None


def request_hook(consumer: Any) -> RequestHook:
    """The consumer's :class:`RequestHook`, made on first use."""
    hook: RequestHook | None = getattr(consumer, HOOK_ATTR, None)
    if hook is None:
        hook = RequestHook()
        setattr(consumer, HOOK_ATTR, hook)
    return hook


def _hooked_class(base: type[Request], hook: RequestHook) -> type[Request]:
    """A subclass of request class *base* whose callbacks tell *hook* how it went."""
    namespace = {
        "__slots__": (),
        _HOOKED: True,
        "__module__": base.__module__,
        "__doc__": base.__doc__,
        **_pool_callbacks(base, hook),
        **_ending_callbacks(base, hook),
    }
    hooked: type[Request] = type(base.__name__, (base,), namespace)
    return hooked


def _pool_callbacks(base: type[Request], hook: RequestHook) -> dict[str, Callable[..., Any]]:
    """The pool's callbacks of *base* (started, succeeded, failed, timed out), each telling
    *hook* first."""
    base_accepted, base_success, base_failure = base.on_accepted, base.on_success, base.on_failure
    base_timeout = base.on_timeout

    def on_accepted(self: Any, pid: Any, time_accepted: Any) -> Any:
        hook.started(self)
        return base_accepted(self, pid, time_accepted)

    # the task is over when its outcome reaches the main process: the hook hears it
    # first, so the next waiter starts while Celery acks, sends events and stores it
    def on_success(self: Any, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        hook.succeeded(self, failed__retval__runtime)
        return base_success(self, failed__retval__runtime, **kwargs)

    def on_failure(self: Any, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
        hook.failed(self, exc_info)
        return base_failure(self, exc_info, *args, **kwargs)

    def on_timeout(self: Any, soft: bool, timeout: Any) -> Any:
        if not soft:  # the pool kills the process: it runs no more
            hook.ended(self)
        return base_timeout(self, soft, timeout)

    return {
        "on_accepted": on_accepted,
        "on_success": on_success,
        "on_failure": on_failure,
        "on_timeout": on_timeout,
    }


def _ending_callbacks(base: type[Request], hook: RequestHook) -> dict[str, Callable[..., Any]]:
    """The methods of *base* that end a request no pool callback follows (revoked before the
    pool, terminated or cancelled while running), each telling *hook* it ended."""
    base_execute = base.execute_using_pool
    base_terminate, base_cancel = base.terminate, base.cancel

    # revoke with terminate, and cancel on a lost connection, kill the running process and
    # mark the request ready: no pool callback follows
    def terminate(self: Any, pool: Any, signal: Any = None) -> Any:
        running = bool(self.time_start)
        try:
            return base_terminate(self, pool, signal)
        finally:
            if running:
                hook.ended(self)

    def cancel(self: Any, pool: Any, *args: Any, **kwargs: Any) -> Any:
        running = bool(self.time_start)
        try:
            return base_cancel(self, pool, *args, **kwargs)
        finally:
            if running:
                hook.ended(self)

    def execute_using_pool(self: Any, pool: Any, **kwargs: Any) -> Any:
        try:
            return base_execute(self, pool, **kwargs)
        except (TaskRevokedError, Exception):
            hook.ended(self)  # revoked (or refused) before reaching the pool
            raise

    return {"execute_using_pool": execute_using_pool, "terminate": terminate, "cancel": cancel}
