"""Batching as a policy of the admission pipeline: ``batch()``, its gate, and the ``retry``
of a batched task, in one entry of ``celery_extras.policies.POLICIES``."""

from __future__ import annotations

from typing import Any

from celery import Task

from ..admission.policy import Policy
from .gate import BatchGate
from .runner import install_batch

__all__ = ["BATCH"]


def _apply(task: Task, spec: Any) -> None:
    install_batch(task)


BATCH = Policy(name="batch", decorator="batch()", gate=BatchGate, apply=_apply, info_key="batch")
