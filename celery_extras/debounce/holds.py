"""The debounce holds a worker asks: the store's, through its health, or its own table.

With a store, every call goes to :class:`~.redis_holds.RedisDebounce` unless the store
is backing off after a failure, or may evict the holds (see
:mod:`celery_extras.store.safety`: they are leased holds, as coalescing's); then the call
answers ``None`` at once and the gate does what ``extras_debounce_on_store_error`` says.
With no store at all, the holds are this worker's :class:`~.table.DebounceTable`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from celery import Celery

from ..admission.notices import Bucket, ReleaseNotices
from ..clock import wall
from ..store.client import redis_client, store_key, store_safety, store_url
from ..store.health import StoreUser
from ..store.safety import COALESCING
from .redis_holds import RedisDebounce
from .table import DebounceFinished, DebounceTable, DebounceVerdict

__all__ = ["DebounceHolds", "DebounceStore"]

R = TypeVar("R")


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


class DebounceHolds:
    """Where one worker's debounce holds are, and the one way it calls them."""

    def __init__(self, app: Celery, health: StoreUser,
                 wall: Callable[[], float] = wall) -> None:  # fmt: skip
        self.app = app
        self.health = health
        self.safety = store_safety(app)
        #: the holds are the store's, shared by every worker (else this worker's table)
        self.shared = store_url(app) is not None
        self.local = DebounceTable(wall)
        self._store: RedisDebounce | None = None

    @property
    def store(self) -> RedisDebounce:
        if self._store is None:
            self._store = RedisDebounce(redis_client(self.app), store_key(self.app))
        return self._store

    def ask(self, operation: Callable[[DebounceStore], DebounceVerdict]) -> DebounceVerdict | None:
        """*operation* (an ``ask``) on the holds; ``None`` when the store cannot (or must
        not) answer."""
        if self.shared and self.safety.evicts(COALESCING):
            return None
        return self.call(operation)

    def call(self, operation: Callable[[DebounceStore], R]) -> R | None:
        """``operation(holds)``; ``None`` when the store is away (a hold's lease ends what a
        lost call would have ended)."""
        if not self.shared:
            return operation(self.local)
        if not self.health.up():
            return None
        try:
            answer = operation(self.store)
        except Exception as exc:
            self.health.failed(exc)
            return None
        self.health.answered()
        return answer

    def listen(self, notices: ReleaseNotices) -> None:
        """Have *notices* hear the runs that end with a next message due (shared holds only)."""
        if not self.shared or notices.listening:
            return
        try:
            notices.listen(self.store)
        except Exception as exc:
            self.health.failed(exc)
