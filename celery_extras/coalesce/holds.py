"""The coalescing holds a worker asks: the store's, through its health, or its own table.

With a store, every call goes to :class:`~.redis_holds.RedisHolds` unless the store
is backing off after a failure, or may evict the holds (see
:mod:`celery_extras.store.safety`); then the call answers ``None`` at once and the
gate does what ``extras_coalesce_on_store_error`` says. With no store at all, the
holds are this worker's :class:`~.table.CoalesceTable`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery

from ..admission.notices import ReleaseNotices
from ..clock import wall
from ..store.client import redis_client, store_key, store_safety, store_url
from ..store.health import StoreUser
from ..store.safety import COALESCING
from .redis_holds import RedisHolds
from .table import CoalesceTable, Verdict

__all__ = ["Holds"]


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

    def ask(self, *args: Any) -> Verdict | None:
        """``ask(*args)`` of the holds; ``None`` when the store cannot (or must not) answer."""
        if self.shared and self.safety.evicts(COALESCING):
            return None
        verdict: Verdict | None = self.call("ask", *args)
        return verdict

    def call(self, what: str, *args: Any) -> Any:
        """``<holds>.<what>(*args)``; ``None`` when the store is away (a hold's lease ends
        what a lost call would have ended)."""
        if not self.shared:
            return getattr(self.local, what)(*args)
        if not self.health.up():
            return None
        try:
            answer = getattr(self.store, what)(*args)
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
