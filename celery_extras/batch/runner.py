"""A batch as one job of the pool: the task called once with its calls, in the pool process.

:func:`run_batch` is what the pool runs (a module-level function, so a prefork pool process
finds it by name). It never raises: it returns how the batch ended, as plain data the
worker's main process ends every call with (:class:`BatchEnding`). A task's ``self.retry()``
(or its ``retry_policy``) inside a batch raises :class:`BatchRetry` instead of publishing a
retry of the batch: the main process retries every call, each as its own message.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from celery import Task, current_app
from celery.exceptions import Retry

from .call import Call

__all__ = [
    "BatchEnding",
    "BatchResultError",
    "BatchRetry",
    "exception_of",
    "in_batch",
    "install_batch",
    "run_batch",
]

_local = threading.local()

#: How a batch ended: ``("success", [result per call])``, ``("failure", exception,
#: traceback text)`` or ``("retry", countdown or eta, exception or None, max_retries)``;
#: exceptions as the result backend stores them (:func:`exception_of` reads them back), so
#: any exception crosses from the pool process.
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
    """Make *task*'s ``retry`` retry its batch's calls when it runs as a batch, and turn off
    Celery's argument check (``typing``): a call's arguments are not the function's
    (``def add(calls)``), so ``add.delay(1, 2)``, a chain's or a chord's callback would
    fail it (idempotent)."""
    task.typing = False
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
    task._extras_batch_retry = True


def _stored(task: Task | None, exc: BaseException) -> Any:
    backend = task.backend if task is not None else current_app.backend
    return backend.prepare_exception(exc)


def exception_of(app: Any, stored: Any) -> BaseException:
    """The exception *stored* stands for (as :func:`run_batch` returned it)."""
    exc = app.backend.exception_to_python(stored)
    return exc if isinstance(exc, BaseException) else RuntimeError(repr(stored))


def _failure(exc: BaseException, task: Task | None = None) -> BatchEnding:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ("failure", _stored(task, exc), text)


def run_batch(name: str, calls: Sequence[Mapping[str, Any]], request: Mapping[str, Any]) -> Any:
    """Call task *name* once with *calls* (each ``{"id", "args", "kwargs", "headers"}``), on
    *request* (its ``self.request``); how it ended (:data:`BatchEnding`)."""
    try:
        task = current_app.tasks[name]
        batch = [Call(c["id"], tuple(c["args"]), dict(c["kwargs"]), dict(c["headers"]))
                 for c in calls]  # fmt: skip
    except Exception as exc:  # the task is not known here, or the calls are not readable
        return _failure(exc)
    task.push_request(**request, args=[batch], kwargs={}, called_directly=False, is_eager=False)
    _local.batch = True
    try:
        returned = task.run(batch)
    except Retry as retry:  # self.retry() (BatchRetry), or a Retry raised by hand
        reason = retry.exc if isinstance(retry.exc, BaseException) else None
        limit = retry.max_retries if isinstance(retry, BatchRetry) else None
        return ("retry", retry.when, reason and _stored(task, reason), limit)
    except Exception as exc:
        return _failure(exc, task)
    finally:
        _local.batch = False
        task.pop_request()
    if returned is None:
        return ("success", [None] * len(batch))
    if not isinstance(returned, list | tuple) or len(returned) != len(batch):
        got = f"{len(returned)} results" if isinstance(returned, list | tuple) else repr(returned)
        return _failure(task=task, exc=BatchResultError(
            f"batch task {name} returned {got[:200]} for {len(batch)} calls: expected a list "
            "of one result per call, in their order, or None"
        ))  # fmt: skip
    return ("success", list(returned))
