"""The debounce holds a worker asks: the store's, through its health, or its own table
(:class:`~celery_extras.admission.key_runs.KeyHolds`); while the store cannot answer the
gate does what ``extras_debounce_on_store_error`` says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from celery import Celery

from ..admission.key_runs import KeyHolds
from ..admission.notices import Bucket
from ..clock import wall
from ..store.health import StoreUser
from .redis_holds import RedisDebounce
from .table import DebounceFinished, DebounceTable, DebounceVerdict

__all__ = ["DebounceHolds", "DebounceStore"]


class DebounceStore(Protocol):
    """What the gate asks of the holds: :class:`~.table.DebounceTable` (one worker's) and
    :class:`~.redis_holds.RedisDebounce` (the cluster's) both answer it."""

    def ask(self, bucket: Bucket, mid: str, sent: float, holder: str, wait: float,
            max_wait: float | None, lease: float, retries: int = 0,
            context: str = "") -> DebounceVerdict: ...  # fmt: skip

    def finish(self, bucket: Bucket, mid: str, holder: str) -> DebounceFinished | None: ...

    def step_aside(self, bucket: Bucket, mid: str, holder: str, seconds: float,
                   lease: float) -> bool: ...  # fmt: skip

    def park_next(self, bucket: Bucket, mid: str, holder: str, entry: str,
                  seconds: float, lease: float) -> bool: ...  # fmt: skip

    def drop(self, bucket: Bucket, mid: str) -> DebounceFinished | None: ...

    def forget(self, bucket: Bucket, mid: str, holder: str) -> None: ...

    def renew(self, bucket: Bucket, ids: list[str], holder: str,
              lease: float) -> list[str]: ...  # fmt: skip


class DebounceHolds(KeyHolds[DebounceStore]):
    """Where one worker's debounce holds are: the store's :class:`~.redis_holds.RedisDebounce`
    or this worker's :class:`~.table.DebounceTable`."""

    def __init__(self, app: Celery, health: StoreUser,
                 wall: Callable[[], float] = wall) -> None:  # fmt: skip
        super().__init__(app, health, DebounceTable(wall), RedisDebounce)
