"""One call of a batched task: what the task function receives, a list of them a batch.

No Celery import: a call is plain data (its message's id, arguments and headers), made in
the worker's main process and handed to the pool process that runs the batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call"]


@dataclass(frozen=True)
class Call:
    """One message of a batch: its task *id*, *args*, *kwargs* and *headers*."""

    id: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, Any] = field(default_factory=dict)
