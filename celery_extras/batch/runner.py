"""A batch as one job of the pool: the task called once with its calls, in the pool process.

:func:`run_batch` is what the pool runs (a module-level function, so a prefork pool process
finds it by name). It never raises: it returns how the batch ended, as plain data the
worker's main process ends every call with (:class:`BatchEnding`). A task's ``self.retry()``
(or its ``retry_policy``) inside a batch raises :class:`BatchRetry` instead of publishing a
retry of the batch: the main process retries every call, each as its own message. A batch
sends ``task_prerun`` and ``task_postrun`` once, and is the current task while it runs;
``apply()`` and eager calls run a batched task as a batch of one, an eager group of its
calls as one batch (:func:`install_batch`, :mod:`.eager`).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from celery import Task, current_app, signals, states
from celery.exceptions import Retry

from . import eager as eager_group
from .call import Call, CallRetry

__all__ = [
    "BatchEnding",
    "BatchResultError",
    "BatchRetry",
    "eager_call",
    "exception_of",
    "in_batch",
    "install_batch",
    "read_ending",
    "run_batch",
]

_local = threading.local()

#: How a batch ended: ``("success", [result per call], {index: ending of that call})``,
#: ``("failure", exception, traceback text)`` or ``("retry", countdown or eta, exception or
#: None, max_retries)``; a call whose item is an exception or a :meth:`Call.retry` has its
#: own ending (a failure or a retry) in the third part of a success. Exceptions as the result
#: backend stores them (:func:`exception_of` reads them back), so any exception crosses from
#: the pool process.
BatchEnding = tuple[Any, ...]


class BatchResultError(Exception):
    """A batched task returned something else than one result per call (or ``None``)."""


class BatchRetry(Retry):
    """``self.retry()`` inside a batch: every call of the batch is retried by the worker."""

    def __init__(self, exc: BaseException | None, when: Any, max_retries: int | None) -> None:
        super().__init__(exc=exc, when=when)
        self.max_retries = max_retries


def in_batch() -> bool:
    """Whether this thread runs a batch now."""
    return bool(getattr(_local, "batch", False))


def install_batch(task: Task) -> None:
    """Make *task*'s ``retry`` retry its batch's calls when it runs as a batch, its ``run``
    take a batch's request (:func:`run_batch`) or run an eager call (``apply()``,
    ``task_always_eager``) as a batch of one, and turn off Celery's argument check
    (``typing``): a call's arguments are not the function's (``def add(calls)``), so
    ``add.delay(1, 2)``, a chain's or a chord's callback would fail it (idempotent)."""
    task.typing = False
    eager_group.install_group_apply()
    if task.__dict__.get("_extras_batch_retry"):
        return
    original = task.retry

    def retry(args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: datetime | None = None, countdown: float | None = None,
              max_retries: int | None = None, **options: Any) -> Any:  # fmt: skip
        if in_batch():
            raise BatchRetry(exc, eta if eta is not None else countdown, max_retries)
        return original(args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta,
                        countdown=countdown, max_retries=max_retries, **options)  # fmt: skip

    task.retry = retry
    task.run = _batch_run(task, task.run)
    task._extras_batch_retry = True


def _batch_run(task: Task, run: Callable[..., Any]) -> Callable[..., Any]:
    """*task*'s ``run`` (*run*) as a batched task's: in a batch, on the batch's request;
    eager, with the call as a batch of one, its item as the result; else as it is."""

    def batch_run(*args: Any, **kwargs: Any) -> Any:
        request = task.request
        fields = getattr(_local, "request", None)
        if in_batch() and fields is not None and fields.get("task") == task.name:
            _local.request = None  # Task.__call__ pushed a bare request: the batch's now
            request.update(fields)
            return _signalled(task, run, args, kwargs)
        if in_batch() or not getattr(request, "is_eager", False):
            return run(*args, **kwargs)
        item = _eager_item(task, run, eager_call(request, args, kwargs))
        if isinstance(item, BaseException):  # this call's own failure
            raise item
        if isinstance(item, CallRetry):  # retried eagerly, as self.retry() is
            raise task.retry(exc=item.exc, countdown=item.countdown, eta=item.eta,
                             max_retries=item.max_retries)  # fmt: skip
        return item

    return batch_run


def _eager_item(task: Task, run: Callable[..., Any], own: Call) -> Any:
    """The item of eager call *own*: run as a batch of one, or of its eager group's calls
    (:mod:`.eager`), or kept for it by its group's batch."""
    found, item = eager_group.take(own.id)
    if found:
        return item
    calls = eager_group.batch_of(own)
    results = _results(task.name, run(calls), len(calls))
    eager_group.keep(calls, results, own.id)
    return results[[c.id for c in calls].index(own.id)]


def eager_call(request: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call:
    """The one :class:`Call` of an eager run (``apply()``) on *request*: its headers as a
    protocol-2 message has them (its ``id``, ``task``, ``retries``...) and its own."""
    headers = {name: getattr(request, name, None)
               for name in ("id", "task", "retries", "root_id", "parent_id", "group")}  # fmt: skip
    headers.update(getattr(request, "headers", None) or {})
    return Call(request.id, tuple(args), dict(kwargs), headers, name=request.task,
                delivery_info=dict(getattr(request, "delivery_info", None) or {}),
                hostname=request.hostname, reply_to=request.reply_to,
                correlation_id=request.correlation_id, retries=request.retries or 0,
                eta=request.eta, expires=request.expires,
                ignore_result=bool(request.ignore_result))  # fmt: skip


def _results(name: str, returned: Any, count: int) -> list[Any]:
    """One result per call of *count* from what batch task *name* returned (``None``: each
    ``None``); :class:`BatchResultError` when it is not that."""
    if returned is None:
        return [None] * count
    if not isinstance(returned, list | tuple) or len(returned) != count:
        got = f"{len(returned)} results" if isinstance(returned, list | tuple) else repr(returned)
        raise BatchResultError(
            f"batch task {name} returned {got[:200]} for {count} calls: expected a list "
            "of one result per call, in their order, or None"
        )
    return list(returned)


def _own_endings(task: Task, results: list[Any]) -> dict[int, BatchEnding]:
    """The calls of *results* that end otherwise than with their item, by index (their item
    now ``None``): an exception instance fails its call, a :class:`CallRetry` retries it."""
    own: dict[int, BatchEnding] = {}
    for index, item in enumerate(results):
        if isinstance(item, BaseException):
            own[index] = _failure(item, task)
        elif isinstance(item, CallRetry):
            reason = None if item.exc is None else _stored(task, item.exc)
            own[index] = ("retry", item.when, reason, item.max_retries)
        else:
            continue
        results[index] = None
    return own


def _stored(task: Task | None, exc: BaseException) -> Any:
    backend = task.backend if task is not None else current_app.backend
    return backend.prepare_exception(exc)


def exception_of(app: Any, stored: Any) -> BaseException:
    """The exception *stored* stands for (as :func:`run_batch` returned it)."""
    exc = app.backend.exception_to_python(stored)
    return exc if isinstance(exc, BaseException) else RuntimeError(repr(stored))


def read_ending(app: Any, ending: Any) -> BatchEnding:
    """*ending* (as :func:`run_batch` returned it, or the worker's ``("lost" | "error",
    exception, traceback text)``) with its exceptions read back, once for every call; a
    malformed one is an ``"error"`` naming it."""
    kind = ending[0] if isinstance(ending, tuple) and len(ending) >= 2 else None
    if kind == "failure":
        return ("failure", exception_of(app, ending[1]), *ending[2:3])
    if kind == "retry" and len(ending) == 4:
        reason = None if ending[2] is None else exception_of(app, ending[2])
        return ("retry", ending[1], reason, ending[3])
    if kind == "success" and len(ending) == 3 and isinstance(ending[2], dict):
        return ("success", ending[1], {i: read_ending(app, e) for i, e in ending[2].items()})
    if kind in ("success", "lost", "error"):
        return tuple(ending)
    return ("error", RuntimeError(f"unreadable batch ending {ending!r:.200}"), None)


def _failure(exc: BaseException, task: Task | None = None) -> BatchEnding:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ("failure", _stored(task, exc), text)


def run_batch(name: str, calls: Sequence[Mapping[str, Any]], request: Mapping[str, Any]) -> Any:
    """Call task *name* once with *calls* (each the fields of a :class:`Call`), on
    *request* (its ``self.request``), ``task_prerun`` before and ``task_postrun`` after it
    (the batch's id as ``task_id``, the calls as its one argument), and as the current task;
    how it ended (:data:`BatchEnding`)."""
    try:
        task = current_app.tasks[name]
        batch = [Call(**{**c, "args": tuple(c["args"])}) for c in calls]
    except Exception as exc:  # the task is not known here, or the calls are not readable
        return _failure(exc)
    fields = {**request, "task": name, "args": [batch], "kwargs": {}, "called_directly": False,
              "is_eager": False}  # fmt: skip
    _local.batch, _local.request = True, fields
    ending: BatchEnding
    try:
        # Task.__call__ on an empty request stack (its full path, in a worker too): the
        # current task, and a request the installed run fills with the batch's fields, and
        # runs between task_prerun and task_postrun (:func:`_signalled`)
        results = _results(name, task(batch), len(batch))
        ending = ("success", results, _own_endings(task, results))
    except Retry as retry:  # self.retry() (BatchRetry), or a Retry raised by hand
        reason = retry.exc if isinstance(retry.exc, BaseException) else None
        limit = retry.max_retries if isinstance(retry, BatchRetry) else None
        ending = ("retry", retry.when, reason and _stored(task, reason), limit)
    except Exception as exc:
        ending = _failure(exc, task)
    finally:
        _local.batch, _local.request = False, None
    return ending


def _signalled(task: Task, run: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """*run* the batch on the task's request (the batch's now), ``task_prerun`` before and
    ``task_postrun`` after it, as Celery's tracer sends them: inside ``Task.__call__``, so
    the task is ``current_task`` for their receivers too; its results checked
    (:func:`_results`) for ``task_postrun``'s state."""
    request = task.request
    common = {"sender": task, "task_id": request.id, "task": task, "args": request.args,
              "kwargs": {}}  # fmt: skip
    signals.task_prerun.send(**common)
    state, retval = states.FAILURE, None
    try:
        retval = run(*args, **kwargs)
        retval = _results(task.name, retval, len(request.args[0]))
        state = states.SUCCESS
        return retval
    except Retry as retry:
        state, retval = states.RETRY, retry
        raise
    except Exception as exc:
        retval = exc
        raise
    finally:
        signals.task_postrun.send(**common, retval=retval, state=state)
