"""The coalescing holds a worker asks: the store's, through its health, or its own table.

With a store, every call goes to :class:`~.redis_holds.RedisHolds` unless the store
is backing off after a failure, or may evict the holds (see
:mod:`celery_extras.store.safety`); then the call answers ``None`` at once and the
gate does what ``extras_coalesce_on_store_error`` says. With no store at all, the
holds are this worker's :class:`~.table.CoalesceTable`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from celery import Celery

from ..admission.notices import ReleaseNotices
from ..clock import wall
from ..store.client import redis_client, store_key, store_safety, store_url
from ..store.health import StoreUser
from ..store.safety import COALESCING
from .redis_holds import RedisHolds
from .table import CoalesceFinished, CoalesceTable, CoalesceVerdict

__all__ = ["CoalesceHolds", "Holds"]

T = TypeVar("T")

#: ``(task name, key)``: the bucket of one key's holds.
Bucket = tuple[str, str]


class CoalesceHolds(Protocol):
    """What keeps the holds: the store's :class:`~.redis_holds.RedisHolds` or this worker's
    :class:`~.table.CoalesceTable` (see the table for what each answers)."""

    def ask(self, bucket: Bucket, mid: str, sent: float, holder: str, lease: float,
            keep: str, retries: int, context: str = "") -> CoalesceVerdict: ...  # fmt: skip

    def finish(self, bucket: Bucket, mid: str, holder: str) -> CoalesceFinished | None: ...

    def step_aside(self, bucket: Bucket, mid: str, holder: str, seconds: float,
                   lease: float) -> bool: ...  # fmt: skip

    def park_wait(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
                  lease: float) -> bool: ...  # fmt: skip

    def drop(self, bucket: Bucket, mid: str) -> CoalesceFinished | None: ...

    def forget(self, bucket: Bucket, mid: str, holder: str) -> None: ...

    def renew(self, bucket: Bucket, ids: list[str], holder: str, lease: float) -> list[str]: ...


class Holds:
    """Where one worker's coalescing holds are, and the one way it calls them."""

    def __init__(self, app: Celery, health: StoreUser,
                 wall: Callable[[], float] = wall) -> None:  # fmt: skip
        self.app = app
        self.health = health
        self.safety = store_safety(app)
        #: the holds are the store's, shared by every worker (else this worker's table)
        self.shared = store_url(app) is not None
        self.local = CoalesceTable(wall)
        self._store: RedisHolds | None = None

    @property
    def store(self) -> RedisHolds:
        if self._store is None:
            self._store = RedisHolds(redis_client(self.app), store_key(self.app))
        return self._store

    def ask(self, bucket: Bucket, mid: str, sent: float, holder: str, lease: float,
            keep: str, retries: int, context: str = "") -> CoalesceVerdict | None:  # fmt: skip
        """The holds' verdict; ``None`` when the store cannot (or must not) answer."""
        if self.shared and self.safety.evicts(COALESCING):
            return None
        return self._call(lambda h: h.ask(bucket, mid, sent, holder, lease, keep, retries,
                                          context))  # fmt: skip

    def finish(self, bucket: Bucket, mid: str, holder: str) -> CoalesceFinished | None:
        return self._call(lambda h: h.finish(bucket, mid, holder))

    def step_aside(self, bucket: Bucket, mid: str, holder: str, seconds: float,
                   lease: float) -> bool | None:  # fmt: skip
        return self._call(lambda h: h.step_aside(bucket, mid, holder, seconds, lease))

    def park_wait(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
                  lease: float) -> bool | None:  # fmt: skip
        return self._call(lambda h: h.park_wait(bucket, mid, holder, entry, seconds, lease))

    def drop(self, bucket: Bucket, mid: str) -> CoalesceFinished | None:
        return self._call(lambda h: h.drop(bucket, mid))

    def forget(self, bucket: Bucket, mid: str, holder: str) -> None:
        self._call(lambda h: h.forget(bucket, mid, holder))

    def renew(self, bucket: Bucket, ids: list[str], holder: str, lease: float) -> list[str]:
        return self._call(lambda h: h.renew(bucket, ids, holder, lease)) or []

    def _call(self, call: Callable[[CoalesceHolds], T]) -> T | None:
        """*call* on the holds; ``None`` when the store is away (a hold's lease ends what a
        lost call would have ended)."""
        if not self.shared:
            return call(self.local)
        if not self.health.up():
            return None
        try:
            answer = call(self.store)
        except Exception as exc:
            self.health.failed(exc)
            return None
        self.health.answered()
        return answer

    def listen(self, notices: ReleaseNotices) -> None:
        """Have *notices* hear the runs that end with a run waiting (shared holds only)."""
        if not self.shared or notices.listening:
            return
        try:
            notices.listen(self.store)
        except Exception as exc:
            self.health.failed(exc)
