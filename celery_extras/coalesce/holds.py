"""The coalescing holds a worker asks: the store's, through its health, or its own table
(:class:`~celery_extras.admission.key_runs.KeyHolds`); while the store cannot answer the
gate does what ``extras_coalesce_on_store_error`` says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

from celery import Celery

from ..admission.key_runs import KeyHolds
from ..admission.notices import Bucket
from ..admission.store_round import NO_REPLY, StoreCall
from ..clock import wall
from ..store.health import StoreUser
from .redis_holds import RedisHolds
from .table import CoalesceFinished, CoalesceTable, CoalesceVerdict

__all__ = ["CoalesceHolds", "Holds"]


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


class Holds(KeyHolds[CoalesceHolds]):
    """Where one worker's coalescing holds are, and what the gate asks of them."""

    def __init__(self, app: Celery, health: StoreUser,
                 wall: Callable[[], float] = wall) -> None:  # fmt: skip
        super().__init__(app, health, CoalesceTable(wall), RedisHolds)

    def ask(self, bucket: Bucket, mid: str, sent: float, holder: str, lease: float,
            keep: str, retries: int, context: str = "") -> CoalesceVerdict | None:  # fmt: skip
        """The holds' verdict; ``None`` when the store cannot (or must not) answer."""
        return self.claim(lambda h: h.ask(bucket, mid, sent, holder, lease, keep, retries,
                                          context))  # fmt: skip

    def ask_call(self, bucket: Bucket, mid: str, sent: float, holder: str, lease: float,
                 keep: str, retries: int, context: str = "", may_wait: bool = False
                 ) -> StoreCall:  # fmt: skip
        """The store's ask, as data (for a round: :meth:`joins_rounds`)."""
        return self._redis().ask_call(bucket, mid, sent, holder, lease, keep, retries, context,
                                      may_wait)  # fmt: skip

    def finish_call(self, bucket: Bucket, mid: str, holder: str,
                    may_wait: bool = False) -> StoreCall:  # fmt: skip
        """The store's finish, as data (for a round: :meth:`joins_rounds`)."""
        return self._redis().finish_call(bucket, mid, holder, may_wait)

    def _redis(self) -> RedisHolds:
        return cast("RedisHolds", self.store)

    def asked(self, reply: Any) -> CoalesceVerdict | None:
        """The verdict in a round's *reply* to :meth:`ask_call`; ``None`` if the round failed."""
        return self.read(lambda: RedisHolds.verdict(reply))

    def finish(self, bucket: Bucket, mid: str, holder: str,
               reply: Any = NO_REPLY) -> CoalesceFinished | None:  # fmt: skip
        """The run ended (*reply*: a round's reply to :meth:`finish_call`, read instead)."""
        if reply is not NO_REPLY:
            return self.read(lambda: self._redis().finished(bucket, reply))
        return self.call(lambda h: h.finish(bucket, mid, holder))

    def step_aside(self, bucket: Bucket, mid: str, holder: str, seconds: float,
                   lease: float) -> bool | None:  # fmt: skip
        return self.call(lambda h: h.step_aside(bucket, mid, holder, seconds, lease))

    def park_wait(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
                  lease: float) -> bool | None:  # fmt: skip
        return self.call(lambda h: h.park_wait(bucket, mid, holder, entry, seconds, lease))

    def drop(self, bucket: Bucket, mid: str) -> CoalesceFinished | None:
        return self.call(lambda h: h.drop(bucket, mid))

    def forget(self, bucket: Bucket, mid: str, holder: str) -> None:
        self.call(lambda h: h.forget(bucket, mid, holder))

    def renew(self, bucket: Bucket, ids: list[str], holder: str, lease: float) -> list[str]:
        return self.call(lambda h: h.renew(bucket, ids, holder, lease)) or []
