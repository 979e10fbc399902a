"""The holds a key-run gate asks: the store's (its policy's Redis form, through the store's
health) or, with no store, this worker's own table; both answer :class:`KeyStore`, with the
policy's own arguments after each operation's shared ones. While the store cannot answer,
a call answers ``None`` and the gate does what its ``on_store_error`` setting says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from celery import Celery

from ..admission.notices import Bucket
from ..admission.store_round import NO_REPLY, StoreCall
from ..store.health import StoreUser
from .runs import KeyHolds
from .table import KeyFinished, KeyVerdict

__all__ = ["KeyRunHolds", "KeyStore"]


class KeyStore(Protocol):
    """What keeps a policy's holds: its pure table (one worker's) or its Redis form (the
    cluster's). *question* and *ending* are the policy's own arguments."""

    def ask(self, bucket: Bucket, *question: Any) -> KeyVerdict: ...

    def finish(self, bucket: Bucket, mid: str, holder: str, *ending: Any) -> KeyFinished | None: ...

    def step_aside(self, bucket: Bucket, mid: str, holder: str, seconds: float,
                   lease: float) -> bool: ...  # fmt: skip

    def park(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
             lease: float) -> bool: ...  # fmt: skip

    def drop(self, bucket: Bucket, mid: str) -> KeyFinished | None: ...

    def forget(self, bucket: Bucket, mid: str, holder: str) -> None: ...

    def renew(self, bucket: Bucket, ids: list[str], holder: str, lease: float) -> list[str]: ...


class KeyRunHolds(KeyHolds[Any]):
    """Where one worker's holds of a key-run policy are, and what its gate asks of them:
    *local* (its table) or the store's, made by ``connect(client, prefix)``; a store form
    with ``ask_call``/``finish_call`` also answers in rounds (:meth:`joins_rounds`)."""

    def __init__(self, app: Celery, health: StoreUser, local: KeyStore,
                 connect: Callable[[Any, str], Any]) -> None:  # fmt: skip
        super().__init__(app, health, local, connect)
        self.rounds = hasattr(connect, "ask_call")

    def joins_rounds(self) -> bool:
        return self.rounds and super().joins_rounds()

    def ask(self, bucket: Bucket, *question: Any) -> KeyVerdict | None:
        """The holds' verdict; ``None`` when the store cannot (or must not) answer."""
        return self.claim(lambda h: h.ask(bucket, *question))

    def ask_call(self, bucket: Bucket, *question: Any, may_wait: bool = False) -> StoreCall:
        """The store's ask, as data (for a round: :meth:`joins_rounds`)."""
        return self.store.ask_call(bucket, *question, may_wait=may_wait)  # type: ignore[no-any-return]

    def asked(self, reply: Any) -> KeyVerdict | None:
        """The verdict in a round's *reply* to :meth:`ask_call`; ``None`` if the round failed."""
        return self.read(lambda: self.store.verdict(reply))

    def finish_call(self, bucket: Bucket, mid: str, holder: str, *ending: Any,
                    may_wait: bool = False) -> StoreCall:  # fmt: skip
        """The store's finish, as data (for a round: :meth:`joins_rounds`)."""
        return self.store.finish_call(bucket, mid, holder, *ending,  # type: ignore[no-any-return]
                                      may_wait=may_wait)  # fmt: skip

    def finish(self, bucket: Bucket, mid: str, holder: str, *ending: Any,
               reply: Any = NO_REPLY) -> KeyFinished | None:  # fmt: skip
        """The run ended (*reply*: a round's reply to :meth:`finish_call`, read instead)."""
        if reply is not NO_REPLY:
            return self.read(lambda: self.store.finished(bucket, reply))
        return self.call(lambda h: h.finish(bucket, mid, holder, *ending))

    def step_aside(self, bucket: Bucket, mid: str, holder: str, seconds: float,
                   lease: float) -> bool | None:  # fmt: skip
        return self.call(lambda h: h.step_aside(bucket, mid, holder, seconds, lease))

    def park(self, bucket: Bucket, mid: str, holder: str, entry: str, seconds: float,
             lease: float) -> bool | None:  # fmt: skip
        return self.call(lambda h: h.park(bucket, mid, holder, entry, seconds, lease))

    def drop(self, bucket: Bucket, mid: str) -> KeyFinished | None:
        return self.call(lambda h: h.drop(bucket, mid))

    def forget(self, bucket: Bucket, mid: str, holder: str) -> None:
        self.call(lambda h: h.forget(bucket, mid, holder))

    def renew(self, bucket: Bucket, ids: list[str], holder: str, lease: float) -> list[str]:
        return self.call(lambda h: h.renew(bucket, ids, holder, lease)) or []
