"""The consumer as the strategy of a task with a policy sees it: requests go to the pipeline.

A task with a policy keeps Celery's strategy (or its own), built on an
:class:`AdmittedConsumer`: where the strategy would hand a request to the pool
(``on_task_request``) or run it after its ETA (``apply_eta_task``), the request
enters the admission pipeline instead.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task
from celery.utils.imports import instantiate, symbol_by_name
from celery.worker.strategy import default as default_strategy

from .. import compat
from .pipeline import PIPELINE_ATTR, Pipeline
from .registry import policies_of

__all__ = ["AdmittedConsumer", "admitted_strategy"]

logger = logging.getLogger(__name__)


def _no_reserve(request: Any) -> None:
    """Stand-in for ``task_reserved`` in the strategy: the pipeline reserves at go time."""


class AdmittedConsumer:
    """The consumer, with a task's requests going through the pipeline on their way."""

    def __init__(self, consumer: Any, pipeline: Pipeline, name: str) -> None:
        self._consumer = consumer
        self._pipeline = pipeline
        self._name = name
        self._epoch = pipeline.epoch  # strategies are built anew per connection

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._consumer, attr)

    def on_task_request(self, request: Any) -> None:
        self._pipeline.submit(self._consumer, request, self._name)

    def apply_eta_task(self, request: Any) -> None:
        if self._epoch != self._pipeline.epoch:
            # The ETA timer of a message of a lost connection (Celery 5.7 cancels those on
            # close; 5.5 and 5.6 let them fire): the broker delivers it again, so running it
            # here would run it twice. Its connection's prefetch window is gone too.
            logger.debug("celery-extras: %s[%s] of a lost connection dropped", self._name,
                         getattr(request, "id", "?"))  # fmt: skip
            return
        compat.narrow_prefetch(self._consumer)  # the strategy widened it for the ETA wait
        self._pipeline.submit(self._consumer, request, self._name)


def admitted_strategy(task: Task, app: Celery, consumer: Any, **kwargs: Any) -> Any:
    """Strategy of a task with a policy: its own strategy, on an :class:`AdmittedConsumer`."""
    original = task.__dict__.get("_extras_strategy") or type(task).Strategy
    pipeline: Pipeline | None = getattr(consumer, PIPELINE_ATTR, None)
    policies = policies_of(task)
    if pipeline is None or policies is None or not pipeline.register(task.name, policies):
        return instantiate(original, task, app, consumer, **kwargs)
    if symbol_by_name(original) is default_strategy:
        kwargs.setdefault("task_reserved", _no_reserve)
    return instantiate(original, task, app, AdmittedConsumer(consumer, pipeline, task.name),
                       **kwargs)  # fmt: skip
