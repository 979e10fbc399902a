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

__all__ = ["ENDED_HERE", "NOTHING", "KeyRunHolds", "KeyStore"]

#: What a finish answers when its message was no longer the key's run: nothing to end.
NOTHING = KeyFinished([])
#: How many ids of covered messages ended where they arrived a worker without a store keeps.
ENDED_HERE = 10_000


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
        self._ended_here: dict[str, None] = {}  # without a store: the last ENDED_HERE ids

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
                                      may_wait=may_wait, settle=True)  # fmt: skip

    def finish(self, bucket: Bucket, mid: str, holder: str, *ending: Any,
               reply: Any = NO_REPLY, now: bool = False) -> KeyFinished | None:  # fmt: skip
        """The run ended (*reply*: a round's reply to :meth:`finish_call`, read instead): what
        it covered (nothing when it was no longer the key's run); ``None`` when the store did
        not answer (it may have done the finish: the caller asks again, and the store answers
        with the endings the run still owes). *now*: asked even while backing off."""
        if reply is not NO_REPLY:
            done = self.read(lambda: (self.store.finished(bucket, reply) or NOTHING,))
        else:
            settle = {"settle": True} if self.shared else {}  # owed until ended (the store's)
            done = self.call(
                lambda h: (h.finish(bucket, mid, holder, *ending, **settle) or NOTHING,), now
            )
        return None if done is None else done[0]

    def ended(self, bucket: Bucket, by: str, holder: str) -> bool:
        """The endings run *by* owed are published (shared holds: forgotten by the store);
        ``False`` when the store did not answer."""
        if not self.shared:
            return True
        return self.call(lambda h: (h.ended(bucket, by, holder), True)[1]) is not None

    def mark_ended(self, bucket: Bucket, mid: str) -> None:
        """Covered message *mid* was ended where it arrived (remembered: by the store, or
        by this worker without one)."""
        if not self.shared:
            self._ended_here[mid] = None
            while len(self._ended_here) > ENDED_HERE:
                self._ended_here.pop(next(iter(self._ended_here)))
            return
        self.call(lambda h: h.mark_ended(bucket, mid))

    def was_ended(self, bucket: Bucket, mid: str) -> bool:
        """Whether covered message *mid* was ended already (``False`` when the store does
        not answer: it is ended again, at least once)."""
        if not self.shared:
            return mid in self._ended_here
        return bool(self.call(lambda h: h.was_ended(bucket, mid)))

    def note_owed(self, bucket: Bucket) -> None:
        """*bucket* owes endings (shared holds): a sweep finds it if its finisher dies. Asked
        even while backing off from the store: the finish just answered, and without this
        note what the run owes is found by no sweep."""
        if self.shared:
            self.call(lambda h: h.note_owed(bucket), now=True)

    def owed_due(self, limit: int) -> list[Bucket]:
        """Keys whose owed endings' claim may have run out (shared holds only)."""
        if not self.shared or not self.health.up():
            return []
        return self.call(lambda h: h.owed_due(limit)) or []

    def claim_owed(self, bucket: Bucket, holder: str) -> list[tuple[str, KeyFinished]] | None:
        """The owed endings of *bucket* now claimed by *holder*, the key noted again while it
        owes some, forgotten once it owes none; ``None`` when the store did not answer."""
        got: tuple[int, list[tuple[str, KeyFinished]]] | None = self.call(
            lambda h: h.claim_owed(bucket, holder)
        )
        if got is None:
            return None
        left, claimed = got
        self.call(lambda h: h.note_owed(bucket) if left else h.forget_owed(bucket))
        return claimed

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
