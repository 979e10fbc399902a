"""Where a concurrency slot is taken, freed and renewed: this worker's tables or the store.

Each :class:`Grant` names its source, so freeing and renewing a slot asks the place
that gave it: :class:`TableSlots` (``scope="worker"``, or the fallback of global slots
while the store is away), :class:`StoreSlots` (global slots in Redis, with this
worker's tickets in each bucket's queue) or :data:`UNLIMITED` (the store away with
``extras_concurrency_on_store_error='allow'``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..admission.gate import HolderIds
from ..admission.store_round import NO_REPLY, StoreCall, answered
from ..store.health import StoreUser, may_have_been_done
from .kept_slots import KeptSlots
from .redis_slots import HANDOVER_PATIENCE, RedisSlots
from .slot_table import Bucket, SlotTable

__all__ = [
    "TICKET_LEASE",
    "UNLIMITED",
    "Grant",
    "SlotSource",
    "StoreSlots",
    "TableSlots",
    "Unlimited",
    "renew_due",
]

logger = logging.getLogger("celery_extras.concurrency")

#: Longest a worker's ticket (its place in a bucket's queue) lives without renewal.
TICKET_LEASE = 3.0


class SlotSource(Protocol):
    """Where a slot was taken, and so freed and renewed: :class:`TableSlots`,
    :class:`StoreSlots` or :data:`UNLIMITED`. ``renew`` answers the holders whose slot ran
    out, or ``None`` when the store did not answer."""

    kind: str

    def release(self, grant: Grant) -> None: ...

    def renew(self, bucket: Bucket, holders: list[str], lease: float) -> list[str] | None: ...


@dataclass
class Grant:
    """A slot held by one request: where, under which holder id, and how long."""

    bucket: Bucket
    holder: str
    source: SlotSource
    lease: float
    renewed: float


class TableSlots:
    """Slots in a :class:`SlotTable` of this worker."""

    def __init__(self, table: SlotTable, kind: str) -> None:
        self.table = table
        self.kind = kind  # "worker" or "fallback"

    def acquire(self, bucket: Bucket, holder: str, cap: int, lease: float) -> float:
        return self.table.acquire(bucket, holder, cap, lease)

    def release(self, grant: Grant) -> None:
        self.table.release(grant.bucket, grant.holder)

    def renew(self, bucket: Bucket, holders: list[str], lease: float) -> list[str] | None:
        return [h for h in holders if not self.table.renew(bucket, h, lease)]


class Unlimited:
    """No slot at all: the store is away and ``on_store_error='allow'``."""

    kind = "none"

    def release(self, grant: Grant) -> None:
        pass

    def renew(self, bucket: Bucket, holders: list[str], lease: float) -> list[str] | None:
        return []


UNLIMITED = Unlimited()


class StoreSlots:
    """Global slots in the store, and this worker's tickets (its place in each bucket's
    queue while its requests wait there). Every store failure is reported to *health*;
    ``None`` from a call means the store did not answer."""

    kind = "global"

    def __init__(self, store: Callable[[], RedisSlots], health: StoreUser, holders: HolderIds,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self._make_store = store
        self._store: RedisSlots | None = None
        self.health = health
        self.holders = holders
        self.clock = clock
        #: buckets where this worker has a ticket, and when it was last made alive
        self.tickets: dict[Bucket, float] = {}
        #: slots the store may hold for this worker that no request of it uses (a take
        #: whose reply was lost, a release that failed), until when their lease keeps them
        #: (see :meth:`settle`)
        self.unsure: dict[tuple[Bucket, str], float] = {}
        #: slots freed by this worker's requests, kept for its next ones while the cap is
        #: far from binding (see :mod:`.kept_slots`)
        self.kept: KeptSlots[Grant] = KeptSlots(clock)

    @property
    def worker(self) -> str:
        """This worker's id in the store (its tickets, its holders' prefix)."""
        return self.holders.worker

    @property
    def store(self) -> RedisSlots:
        if self._store is None:
            self._store = self._make_store()
        return self._store

    def holder(self) -> str:
        return self.holders()

    def acquire_call(self, bucket: Bucket, holder: str, cap: int, lease: float,
                     more: bool) -> StoreCall:  # fmt: skip
        """:meth:`acquire`'s store call, as data (for a round of the admission pipeline)."""
        return self.store.acquire_call(bucket[0], bucket[1], holder, cap, lease, self.worker,
                                       more, TICKET_LEASE)  # fmt: skip

    def acquire(self, bucket: Bucket, holder: str, cap: int, lease: float,
                more: bool, reply: Any = NO_REPLY) -> float | None:  # fmt: skip
        """``0.0`` when taken, the seconds before asking again, or ``None`` (store away);
        *reply*: a round's reply to :meth:`acquire_call`, read instead of asking."""
        if reply is NO_REPLY and not self.health.up():
            return None
        try:
            if reply is NO_REPLY:
                reply = self.acquire_call(bucket, holder, cap, lease, more)()
            wait = self.store.acquired(reply)
            if wait == 0:
                self.kept.heard(bucket, self.store.holders(reply), cap)
        except Exception as exc:  # the store may have given the slot: freed when it answers
            self._unsure(exc, bucket, holder, lease)
            self.health.failed(exc)
            return None
        self.health.answered()
        self.unsure.pop((bucket, holder), None)  # answered: held (in use) or not
        if wait > 0 or more:  # waits, or was served and queued again
            self.tickets[bucket] = self.clock()
        else:
            self.tickets.pop(bucket, None)
        return wait

    def hand_over(self, grant: Grant, holder: str, cap: int, lease: float, more: bool) -> bool:
        """Free *grant*'s slot, giving it to *holder* of this worker if the store's queue
        allows; ``False`` when the slot went back to the store instead."""
        name, key = grant.bucket
        try:
            handed = self.store.hand_over(
                name, key, grant.holder, holder, cap, lease, self.worker, more,
                HANDOVER_PATIENCE, TICKET_LEASE,
            )  # fmt: skip
        except Exception as exc:  # either holder may have the slot: freed when it answers
            self._unsure(exc, grant.bucket, grant.holder, grant.lease)
            self._unsure(exc, grant.bucket, holder, lease)
            self.health.failed(exc)
            return False
        if handed and more:  # the script keeps (or queues) this worker's ticket
            self.tickets[grant.bucket] = self.clock()
        elif handed:
            self.tickets.pop(grant.bucket, None)
        return bool(handed)

    def reuse(self, bucket: Bucket) -> Grant | None:
        """A slot of *bucket* a request of this worker freed, kept for the next, or ``None``."""
        return self.kept.take(bucket)

    def keep(self, grant: Grant) -> bool:
        """Keep *grant*'s slot, freed by its request, for this worker's next request of the
        bucket; ``False`` when it is to be freed."""
        return self.kept.keep(grant.bucket, grant, _renewal_due(grant))

    def release_call(self, grant: Grant) -> StoreCall:
        """:meth:`release`'s store call, as data."""
        return self.store.release_call(grant.bucket[0], grant.bucket[1], grant.holder)

    def release(self, grant: Grant, reply: Any = NO_REPLY) -> None:
        """Free *grant*'s slot (*reply*: a round's reply to :meth:`release_call`)."""
        try:
            answered(self.release_call(grant)() if reply is NO_REPLY else reply)
        except Exception as exc:  # freed when the store answers, or by its lease
            self._unsure(exc, grant.bucket, grant.holder, grant.lease)
            self.health.failed(exc)

    def _unsure(self, exc: BaseException, bucket: Bucket, holder: str, lease: float) -> None:
        """A call about *holder*'s slot failed with *exc*: noted in :attr:`unsure` when the
        store may have done it (not after a refused connection: settling it would only
        wake the bucket's waiters)."""
        if may_have_been_done(exc):
            self.unsure[(bucket, holder)] = self.clock() + lease

    def settle(self) -> None:
        """Free the slots the store may hold though no request uses them: the kept ones no
        longer to be kept (:meth:`keep`), and (:attr:`unsure`), once it answers again, those
        whose reply was lost: such a slot is not kept until its lease ends (a key of one
        slot would wait that long). Those past their lease are forgotten."""
        self._free(self.kept.stale())
        now = self.clock()
        for (bucket, holder), until in list(self.unsure.items()):
            if until <= now:
                del self.unsure[(bucket, holder)]
                continue
            if not self.health.up():
                return
            try:
                self.store.release(bucket[0], bucket[1], holder)
            except Exception as exc:
                self.health.failed(exc)
                return
            self.health.answered()
            del self.unsure[(bucket, holder)]

    def renew(self, bucket: Bucket, holders: list[str], lease: float) -> list[str] | None:
        """Holders whose lease had run out, or ``None`` when the store was not asked."""
        if not self.health.up():
            return None
        try:
            return self.store.renew(bucket[0], bucket[1], holders, lease)
        except Exception as exc:
            self.health.failed(exc)
            return None

    def stop(self) -> None:
        """The worker's consumer stops: its tickets are dropped and its kept slots freed."""
        for bucket in list(self.tickets):
            self.leave(bucket)
        self._free(self.kept.drain())

    def _free(self, grants: Iterable[Grant]) -> None:
        """Free *grants*, slots no request uses, while the store answers; those it cannot
        be asked about now are freed once it answers again (:meth:`settle`)."""
        for grant in grants:
            if self.health.up():
                self.release(grant)
            else:
                self.unsure[(grant.bucket, grant.holder)] = grant.renewed + grant.lease

    def leave(self, bucket: Bucket) -> None:
        """This worker waits for nothing more in *bucket*: drop its ticket."""
        self.tickets.pop(bucket, None)
        if not self.health.up():
            return
        try:
            self.store.leave(bucket[0], bucket[1], self.worker)
        except Exception as exc:  # the ticket's own lease drops it
            self.health.failed(exc)

    def keep_tickets(self, waiting: Callable[[Bucket], int]) -> list[Bucket]:
        """Keep alive the tickets of buckets where this worker still waits (each once a
        second at most), and drop the others. Returns the buckets whose ticket the store
        had dropped (the worker was blocked past its lease): their queues ask again, which
        queues the worker again (a release is announced only to workers queued)."""
        lost: list[Bucket] = []
        if not self.tickets or not self.health.up():
            return lost
        now = self.clock()
        for bucket, touched in list(self.tickets.items()):
            if not waiting(bucket):
                self.leave(bucket)
                continue
            if now - touched < TICKET_LEASE / 3:
                continue
            self.tickets[bucket] = now
            try:
                if not self.store.touch_ticket(bucket[0], bucket[1], self.worker, TICKET_LEASE):
                    lost.append(bucket)
            except Exception as exc:
                self.health.failed(exc)
                break
        return lost

    def caps(self) -> dict[str, int] | None:
        """The run-time caps in the store, or ``None`` when it did not answer."""
        if not self.health.up():
            return None
        try:
            return self.store.caps()
        except Exception as exc:
            self.health.failed(exc)
            return None


def _renewal_due(grant: Grant) -> float:
    """When *grant*'s lease is next renewed (every third of it)."""
    return grant.renewed + grant.lease / 3


def renew_due(grants: Iterable[Grant], now: float) -> list[tuple[Bucket, float, int]]:
    """Renew the leases of *grants* that are due (every third of the lease), one call per
    bucket and source: each bucket where some had run out, with its lease and how many
    (a source that was not asked renews them at the next call)."""
    due: dict[tuple[Bucket, SlotSource], list[Grant]] = {}
    for grant in grants:
        if now >= _renewal_due(grant):
            due.setdefault((grant.bucket, grant.source), []).append(grant)
    lost_in: list[tuple[Bucket, float, int]] = []
    for (bucket, source), due_grants in due.items():
        lost = source.renew(bucket, [g.holder for g in due_grants], due_grants[0].lease)
        if lost is None:
            continue
        for grant in due_grants:
            grant.renewed = now
        if lost:
            lost_in.append((bucket, due_grants[0].lease, len(lost)))
    return lost_in
