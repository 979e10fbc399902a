"""The slot gate of the admission pipeline: at most *n* runs at once, per task or key.

A request of a task with ``concurrency()`` takes a slot of its bucket (the task, or
the task and its key) and goes on to the pool, or is queued in this gate:

* a queued request takes no pool slot and the prefetch window is widened for it,
  so the tasks behind it keep flowing; its message stays unacked, so a worker
  killed meanwhile loses nothing;
* queued requests of a bucket go first come first served; across workers, the
  store's tickets serve the longest-waiting worker first;
* a slot freed wakes the bucket's queue: at once in this worker (a global slot is
  handed over to the next request here when the store's queue allows), and in the
  others through a release notice (:mod:`~celery_extras.admission.notices`). A queue
  also asks again when the earliest lease runs out (a crashed holder never frees its
  slot);
* a global slot freed while the cap is far from binding is kept for this worker's next
  request of the bucket, which takes it without asking the store (:mod:`.kept_slots`).

The pipeline tells the gate when a request ends, any way; the leases of running
requests are renewed every third of the lease, so a worker that dies gives its
slots back when their leases run out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from celery import Celery

from .. import compat
from ..admission.gate import QUEUED, RUN, Answer, Gate, HolderIds, Ticket
from ..admission.handle import GateHandle
from ..admission.notices import ALL, ReleaseNotices
from ..admission.serial import serial
from ..admission.spec import call_key
from ..admission.store_round import NO_REPLY, PASSES, StoreCall
from ..clock import monotonic
from ..signals import task_concurrency_limited
from ..store.client import redis_client, store_key, store_url, store_user
from .redis_slots import RedisSlots
from .slot_table import Bucket, SlotTable, WaitQueues
from .slots import UNLIMITED, Grant, StoreSlots, TableSlots, renew_due
from .spec import ConcurrencySpec

__all__ = ["MAX_RETRY", "SlotGate"]

logger = logging.getLogger("celery_extras.concurrency")

#: Longest a queue goes without asking again, should every notice be lost.
MAX_RETRY = 5.0
#: What a worker logs when slots ran past their lease before it renewed them.
LOST_LEASES = (
    "celery-extras: %d concurrency slot(s) of %s ran past their lease (%.0f s) before renewal "
    "and were reclaimed (the worker was blocked or cut off from the store); their tasks keep "
    "running"
)
#: :attr:`Ticket.notes` of a request whose slot was kept as it ended (see ``ending_call``)
KEPT = "kept"


class SlotGate(Gate):
    """The concurrency slots of one worker's consumer, as a gate of its admission pipeline."""

    label = "concurrency"
    hears_endings = True

    def __init__(
        self, app: Celery, settings: Mapping[str, Any], clock: Callable[[], float] = monotonic
    ) -> None:
        self.app = app
        self.clock = clock
        self.on_store_error: str = settings["concurrency_on_store_error"]
        self.store_retry: float = settings["store_retry"]
        self.specs: dict[str, ConcurrencySpec] = {}
        self.local = TableSlots(SlotTable(clock), "worker")
        self.fallback = TableSlots(SlotTable(clock), "fallback")
        consequence = (f"global concurrency limits fall back to extras_concurrency_on_store_error="
                       f"{self.on_store_error!r} until it answers")  # fmt: skip
        self.health = store_user(app, logger, "concurrency slots", consequence, clock)
        self.store = StoreSlots(lambda: RedisSlots(redis_client(app), store_key(app)),
                                self.health, HolderIds(), clock)  # fmt: skip
        self.queues: WaitQueues[Ticket] = WaitQueues()
        self.grants: dict[int, Grant] = {}
        self.counts = {"admitted": 0, "waited": 0, "released": 0, "lost_leases": 0}
        self.notices = ReleaseNotices(self._noticed, "concurrency")
        self._handle: Any = None
        self._consumer: Any = None
        self._has_store = store_url(app) is not None
        self._retry: dict[Bucket, Any] = {}  # bucket -> timer entry of its next attempt

    def handles(self, name: str) -> bool:
        return name in self.specs

    def register(self, name: str, policies: Any) -> None:
        if policies.concurrency is not None:
            self.specs[name] = policies.concurrency

    def start(self, handle: GateHandle, consumer: Any) -> None:
        self._handle, self._consumer = handle, consumer
        self.notices.start(consumer)

    def stop(self) -> None:
        """Queued requests are dropped (the broker delivers them again); running ones keep
        their slots until they end."""
        for _bucket, ticket in self.queues.drain():
            compat.forget_held(ticket.request)
        for bucket in list(self._retry):
            self._cancel_retry(bucket)
        self.store.stop()
        self.notices.stop()

    def cap(self, name: str) -> int:
        """The cap of *name*: the run-time one (``celery extras concurrency``) if stored."""
        spec = self.specs[name]
        if spec.scope == "worker" and not self._has_store:
            return spec.n  # no store, nothing to ask (and no outage to log)
        stored = self.store.caps()
        return spec.n if stored is None else stored.get(name, spec.n)

    # -- taking slots --------------------------------------------------------------------------

    def spec_name(self, ticket: Ticket) -> str | None:  # its task's spec, or none
        return ticket.name if ticket.name in self.specs else None

    def _bucket(self, ticket: Ticket) -> Bucket:
        name = str(self.spec_name(ticket))
        return (name, call_key(ticket.name, self.specs[name].key, ticket.request, "concurrency",
                               "slots", logger))  # fmt: skip

    def arrival_call(self, ticket: Ticket) -> StoreCall | None:
        """A global slot's take when the store answers and no request of the bucket waits
        here (it goes first), bucket and holder noted; or a kept slot, noted, taken unasked."""
        name = self.spec_name(ticket)
        spec = self.specs.get(name or "")
        if spec is None or spec.scope != "global" or not self._has_store or not self.health.up():
            return None
        bucket = self._bucket(ticket)
        if self.queues.waiting(bucket):
            return None
        kept = self.store.reuse(bucket)  # a slot an earlier request here freed
        ticket.notes[self.label] = kept or bucket
        return PASSES if kept else self.store.acquire_call(
            bucket, ticket.holder(self.label, self.store.holder), self.cap(str(name)),
            spec.lease, False)  # fmt: skip

    def admit(self, ticket: Ticket) -> Answer:
        name = self.spec_name(ticket)
        if name is None:  # no cap applies to it (a queue not capped: queue_gate.py)
            return RUN
        spec = self.specs[name]
        noted = ticket.notes.pop(self.label, None)
        if isinstance(noted, Grant):  # a kept slot (arrival_call)
            self._granted(ticket, noted)
            return RUN
        bucket = noted or self._bucket(ticket)
        reply = ticket.reply(self.label)
        retry = None
        if reply is not NO_REPLY or not self.queues.waiting(bucket):  # a round asked: its take
            grant, retry = self._take(ticket, bucket, more=False, reply=reply)
            if grant is not None:
                self._granted(ticket, grant)
                return RUN
        self.counts["waited"] += 1
        self.queues.push(bucket, ticket)
        task_concurrency_limited.send(sender=ticket.name, request=ticket.request)
        if spec.scope == "global" and not self.notices.listening:
            try:
                self.notices.listen(self.store.store)
            except Exception as exc:
                self.health.failed(exc)
        if retry is not None:
            self._schedule(bucket, retry)
        return QUEUED

    def _take(self, ticket: Ticket, bucket: Bucket, more: bool,
              reply: Any = NO_REPLY) -> tuple[Grant | None, float]:  # fmt: skip
        """A grant in *bucket* for *ticket* (under its holder id: see :meth:`Ticket.holder`),
        or ``None`` and the seconds before asking again; *reply*: a round's reply to the
        take :meth:`arrival_call` made."""
        holder = ticket.holder(self.label, self.store.holder)
        spec = self.specs[bucket[0]]
        cap = self.cap(bucket[0])
        source: Any = self.local
        if spec.scope == "global":
            wait = self.store.acquire(bucket, holder, cap, spec.lease, more, reply)
            if wait is not None:
                if wait > 0:
                    return None, min(wait, MAX_RETRY)
                return Grant(bucket, holder, self.store, spec.lease, self.clock()), 0.0
            if self.on_store_error == "allow":
                return Grant(bucket, holder, UNLIMITED, spec.lease, self.clock()), 0.0
            if self.on_store_error == "delay":
                return None, self.store_retry
            source = self.fallback
        wait = source.acquire(bucket, holder, cap, spec.lease)
        if wait > 0:
            return None, min(wait, MAX_RETRY)
        return Grant(bucket, holder, source, spec.lease, self.clock()), 0.0

    def _granted(self, ticket: Ticket, grant: Grant) -> None:
        self.counts["admitted"] += 1
        self.grants[id(ticket.request)] = grant

    # -- freeing slots -------------------------------------------------------------------------

    def ending_call(self, ticket: Ticket) -> StoreCall | None:
        """A global slot's release, when no request of this worker waits for it (it would
        be handed over) and the store answers; none when the slot is kept (decided now, as
        the request ends: the round may be answered once the store's word went stale)."""
        grant = self.grants.get(id(ticket.request))
        if (grant is None or grant.source is not self.store or not self.health.up()
                or self.queues.waiting(grant.bucket)):  # fmt: skip
            return None
        kept = self.store.keep(grant)
        if kept:
            ticket.notes[self.label] = KEPT
        return PASSES if kept else self.store.release_call(grant)

    def finished(self, ticket: Ticket) -> None:
        """*ticket*'s request ended: free its slot and let the next in its bucket in."""
        grant = self.grants.pop(id(ticket.request), None)
        if grant is None:
            return
        self.counts["released"] += 1
        if ticket.notes.pop(self.label, None) == KEPT:
            return  # kept as it ended, for this worker's next request of the bucket
        reply = ticket.reply(self.label)
        if reply is not NO_REPLY:
            self.store.release(grant, reply)
        elif grant.source is self.store and self.queues.waiting(grant.bucket) and self.health.up():
            if self._hand_over(grant):
                return
        elif (grant.source is self.store and not self.queues.waiting(grant.bucket)
              and self.store.keep(grant)):  # fmt: skip
            return  # kept for this worker's next request of the bucket
        else:
            grant.source.release(grant)
        self.wake(grant.bucket)

    def _hand_over(self, grant: Grant) -> bool:
        """Give *grant*'s global slot to this worker's next request of the bucket when the
        store's queue allows: ``True`` when that request went on."""
        ticket = self.queues.pop(grant.bucket)
        assert ticket is not None
        spec = self.specs[grant.bucket[0]]
        holder = ticket.holder(self.label, self.store.holder)
        more = self.queues.waiting(grant.bucket) > 0
        if not self.store.hand_over(grant, holder, self.cap(grant.bucket[0]), spec.lease, more):
            self.queues.push_front(grant.bucket, ticket)
            return False
        self._granted(ticket, Grant(grant.bucket, holder, self.store, spec.lease, self.clock()))
        self._handle.resume(ticket)
        return True

    def wake(self, bucket: Bucket) -> None:
        """Let *bucket*'s queue in, first come first served, while slots are free."""
        self._cancel_retry(bucket)
        while True:
            ticket = self.queues.pop(bucket)
            if ticket is None:
                if bucket in self.store.tickets:
                    self.store.leave(bucket)
                return
            grant, retry = self._take(ticket, bucket, more=self.queues.waiting(bucket) > 0)
            if grant is None:
                self.queues.push_front(bucket, ticket)
                self._schedule(bucket, retry)
                return
            self._granted(ticket, grant)
            self._handle.resume(ticket)

    def _noticed(self, bucket: Bucket) -> None:
        for one in self.queues.buckets() if bucket == ALL else [bucket]:
            if self.queues.waiting(one):
                self.wake(one)

    def _schedule(self, bucket: Bucket, seconds: float) -> None:
        if self._consumer is None:
            return
        self._cancel_retry(bucket)
        self._retry[bucket] = serial(self._consumer).call_after(
            max(seconds, 0.001), self._retry_due, (bucket,)
        )

    def _cancel_retry(self, bucket: Bucket) -> None:
        entry = self._retry.pop(bucket, None)
        if entry is not None:
            entry.cancel()

    def _retry_due(self, bucket: Bucket) -> None:
        self._retry.pop(bucket, None)
        self.wake(bucket)

    # -- renewal -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Renew the leases due (every third of the lease), keep this worker's tickets, and
        free the store's slots no request uses, kept ones too (see :meth:`StoreSlots.settle`)."""
        for bucket, lease, lost in renew_due(self.grants.values(), self.clock()):
            self.counts["lost_leases"] += lost
            logger.error(LOST_LEASES, lost, bucket[0], lease)
        for bucket in self.store.keep_tickets(self.queues.waiting):
            self.wake(bucket)
        self.store.settle()

    def queued(self) -> int:
        return len(self.queues)

    def info(self) -> dict[str, Any]:
        return _info(self)


def _info(gate: SlotGate) -> dict[str, Any]:
    """The gate's ``info()``: per task its spec, cap, slots held and requests waiting."""
    tasks = {name: {**spec.describe(), "cap": gate.cap(name), "holding": 0, "waiting": 0}
             for name, spec in gate.specs.items()}  # fmt: skip
    _count(tasks, "holding", ((grant.bucket, 1) for grant in gate.grants.values()))
    _count(tasks, "waiting", ((b, gate.queues.waiting(b)) for b in gate.queues.buckets()))
    return {"tasks": tasks, "holding": len(gate.grants), "waiting": len(gate.queues),
            **gate.store.kept.info(), **gate.counts, "store_errors": gate.health.errors,
            **gate.health.info(), "on_store_error": gate.on_store_error}  # fmt: skip


def _count(tasks: dict[str, dict[str, Any]], column: str,
           buckets: Iterable[tuple[Bucket, int]]) -> None:  # fmt: skip
    """Add each bucket's count to its task's *column* in *tasks*."""
    for (name, _key), count in buckets:
        if name in tasks:
            tasks[name][column] += count
