"""Parking a message: build its :class:`~.entry.Entry`, store it, tell the stats.

Used by the worker's main process (limited tasks, ETA tasks) and by pool
processes (retries). The store's failures are logged once per outage per
process; the caller keeps the message when parking fails.

On a store with replicas (by default: a Sentinel-managed master) a park counts
only once a replica acknowledged it (``WAIT``), so a failover cannot drop a task
whose message was acked. While none does, parks fail (logged once) and are tried
again at most every :data:`REPLICA_RETRY` seconds, so a missing replica does not
cost every task the wait.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis
from celery import Celery
from kombu.entity import Exchange, Queue

from ..clock import monotonic
from ..settings import settings_of
from ..signals import task_parked
from ..store.client import (
    StoreUnavailable,
    redis_client,
    store_key,
    store_kind,
    store_options,
    store_safety,
    store_url,
    store_user,
)
from .entry import (
    CLAIM_HEADER,
    DUE_SUFFIX,
    MESSAGE_PROPERTIES,
    PARKED_HEADER,
    Entry,
    due_queue_name,
    entry_id,
)
from .redis_store import ParkNotReplicated, RedisDelayStore
from .store import DelayStore

__all__ = [
    "CLUSTER_SHARDS",
    "REPLICA_RETRY",
    "STORE_ERRORS",
    "Park",
    "Parker",
    "delay_shards",
    "due_queue",
    "origin_queue",
    "park_replicas",
]

logger = logging.getLogger(__name__)

STORE_ERRORS = (redis.RedisError, StoreUnavailable, OSError)
#: Seconds after a park no replica acknowledged during which parks fail at once (held).
REPLICA_RETRY = 5.0
#: Seconds between the parks of :meth:`Parker.settle`.
SETTLE_EVERY = 0.5


class Park(enum.Enum):
    """How a park went: true only when :attr:`PARKED`. :attr:`IN_DOUBT`: the store may have
    stored it (its reply was lost: a timeout, a connection dropped mid-call), so the caller
    must neither run its copy nor publish another; parking it again settles it (a park of a
    known entry answers stored, and so does its tombstone once a mover released it)."""

    PARKED = "parked"
    KEPT = "kept"
    IN_DOUBT = "in doubt"

    def __bool__(self) -> bool:
        return self is Park.PARKED


def _maybe_done(exc: BaseException) -> bool:
    """Whether the store may have done a call that raised *exc*: anything but a refused
    connection, a refusal of ours or an error the store answered with."""
    if isinstance(exc, redis.TimeoutError):
        return True
    if isinstance(exc, redis.ConnectionError):
        return "connecting to" not in str(exc)
    return False


def park_replicas(app: Celery) -> int:
    """Replicas a park waits for: ``extras_delay_park_replicas``, or by default 1 when the
    store is behind Sentinel (a failover promotes a replica) and 0 otherwise."""
    configured: int | None = settings_of(app).get("delay_park_replicas")
    if configured is not None:
        return configured
    url = store_url(app)
    if url is None:
        return 0
    try:
        return 1 if store_kind(url, store_options(app)) == "sentinel" else 0
    except ValueError:
        return 0


#: Shards of a store on a Redis Cluster unless ``extras_delay_shards`` says otherwise: a
#: multiple of 1, 2, 3, 4 and 6 masters.
CLUSTER_SHARDS = 12


def delay_shards(app: Celery) -> int:
    """Shards of *app*'s delay store: ``extras_delay_shards``, or by default
    :data:`CLUSTER_SHARDS` on a Redis Cluster and 1 elsewhere."""
    configured: int | None = settings_of(app).get("delay_shards")
    if configured is not None:
        return configured
    url = store_url(app)
    try:
        cluster = url is not None and store_kind(url, store_options(app)) == "cluster"
    except ValueError:
        cluster = False
    return CLUSTER_SHARDS if cluster else 1


def due_queue(queue: str) -> Queue:
    """The due queue of *queue*, with a direct exchange of its own (works on every broker)."""
    name = due_queue_name(queue)
    return Queue(name, Exchange(name, type="direct", durable=True), routing_key=name,
                 durable=True)  # fmt: skip


def origin_queue(queues: Iterable[Queue], exchange: str, routing_key: str) -> str | None:
    """The queue among *queues* a message routed by (*exchange*, *routing_key*) came from.

    A message from a due queue belongs to the queue the due queue serves.
    """
    for queue in queues:
        name = queue.name
        ex = queue.exchange.name if queue.exchange is not None else ""
        if (ex == exchange and queue.routing_key == routing_key) or (
            not exchange and name == routing_key
        ):
            return name[: -len(DUE_SUFFIX)] if name.endswith(DUE_SUFFIX) else name
    return None


class Parker:
    """Parks messages of *app* in its delay store (*background*: for work off the worker's
    loop, the mover's and the command line's)."""

    def __init__(
        self,
        app: Celery,
        tombstone_ttl: float = 86400.0,
        clock: Callable[[], float] = monotonic,
        background: bool = False,
    ) -> None:
        self.app = app
        self.background = background  # off the worker's loop: the store's longer timeouts
        self.tombstone_ttl = tombstone_ttl
        self.clock = clock
        self._store: DelayStore | None = None
        self.health = store_user(
            app, logger, "delay store", "waiting tasks are held or kept unacked until it answers",
            clock,
        )  # fmt: skip
        self.safety = store_safety(app)
        #: no replica acknowledged the last park tried; parks fail at once until this time
        self.unreplicated = False
        self._replica_retry_at = 0.0
        self.counts = {"parked": 0, "park_errors": 0, "park_unreplicated": 0, "park_refused": 0,
                       "park_in_doubt": 0}  # fmt: skip

    @property
    def down(self) -> bool:
        return self.health.down

    @property
    def store(self) -> DelayStore:
        if self._store is None:
            settings = settings_of(self.app)
            replicas = park_replicas(self.app)
            # a park that waits for replicas (WAIT, up to extras_delay_park_wait) goes through
            # the client with the longer timeouts: the loop's would end the wait as an outage
            self._store = RedisDelayStore(
                redis_client(self.app, self.background or replicas > 0),
                store_key(self.app),
                self.tombstone_ttl,
                replicas=replicas,
                replica_wait=float(settings.get("delay_park_wait", 1.0)),
                shards=delay_shards(self.app),
            )
        return self._store

    def store_failed(self, what: str, exc: BaseException) -> None:
        """Log a store failure once per outage (per process); a write refused for memory
        (``OOM command not allowed``) is one too. The next park reads the store's eviction
        policy again: the connection that comes back may reach another Redis."""
        self.safety.stale()
        self.health.failed(
            exc, f"while {what}: waiting tasks are held or kept unacked until it answers"
        )

    def store_answered(self) -> None:
        self.health.answered()

    def entry(
        self,
        *,
        task: str,
        kind: str,
        body: bytes | str,
        headers: Mapping[str, Any],
        properties: Mapping[str, Any],
        content_type: str,
        content_encoding: str,
        exchange: str,
        routing_key: str,
    ) -> tuple[str, Entry]:
        """``(entry id, entry)`` for one message (the headers a mover adds are dropped)."""
        kept = {k: v for k, v in headers.items() if k not in (PARKED_HEADER, CLAIM_HEADER)}
        task_id = str(headers.get("id"))
        retries = headers.get("retries")
        source = headers.get(PARKED_HEADER)
        queues = self.app.amqp.queues.consume_from or self.app.amqp.queues
        queue_list = list(queues.values()) if isinstance(queues, Mapping) else []
        payload = body.encode(content_encoding or "utf-8") if isinstance(body, str) else body
        entry = Entry(
            task=task,
            task_id=task_id,
            kind=kind,
            body=payload,
            content_type=content_type,
            content_encoding=content_encoding,
            headers=kept,
            properties={
                k: v for k, v in properties.items() if k in MESSAGE_PROPERTIES and v is not None
            },
            exchange=exchange or "",
            routing_key=routing_key or "",
            queue=origin_queue(queue_list, exchange or "", routing_key or ""),
        )
        number = retries if isinstance(retries, int) and not isinstance(retries, bool) else 0
        return entry_id(task_id, number, kind, str(source or "")), entry

    def entry_of_message(self, message: Any, task: str, kind: str) -> tuple[str, Entry]:
        info = message.delivery_info or {}
        return self.entry(
            task=task,
            kind=kind,
            body=message.body,
            headers=message.headers or {},
            properties=message.properties or {},
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            exchange=info.get("exchange") or "",
            routing_key=info.get("routing_key") or "",
        )

    def park(self, eid: str, entry: Entry, delay: float, request: Any = None) -> Park:
        """Store *entry* due in *delay* s: :attr:`Park.PARKED` when it is stored (now or
        already before), :attr:`Park.KEPT` (logged once per outage) when the store cannot take
        it: the caller keeps the message; :attr:`Park.IN_DOUBT` (see :class:`Park`).
        """
        start = monotonic()
        if not self.health.up():  # the store failed a moment ago: keep the message, at once
            self.counts["park_errors"] += 1
            return Park.KEPT
        refusal = self.safety.refusal()
        if refusal is not None:  # full (a write refused for memory), or it may evict parks
            self.counts["park_errors" if refusal == "full" else "park_refused"] += 1
            return Park.KEPT
        if self.unreplicated and self.clock() < self._replica_retry_at:
            self.counts["park_unreplicated"] += 1
            return Park.KEPT  # no replica acknowledged a park a moment ago: keep it, at once
        try:
            new = self.store.park(eid, entry, delay)
        except ParkNotReplicated as exc:
            self.counts["park_unreplicated"] += 1
            self._replica_retry_at = self.clock() + REPLICA_RETRY
            if not self.unreplicated:
                self.unreplicated = True
                logger.error(
                    "celery-extras: the delay store's replicas do not acknowledge parks (%s) "
                    "while parking %s[%s]; waiting tasks are held or kept unacked until a "
                    "replica does (tried again every %.0f s; logged once per outage)",
                    exc, entry.task, entry.task_id, REPLICA_RETRY,
                )  # fmt: skip
            return Park.KEPT
        except STORE_ERRORS as exc:
            self.counts["park_errors"] += 1
            if isinstance(exc, redis.exceptions.OutOfMemoryError):
                self.safety.full()
            self.store_failed(f"parking {entry.task}[{entry.task_id}]", exc)
            if _maybe_done(exc):
                self.counts["park_in_doubt"] += 1
                return Park.IN_DOUBT
            return Park.KEPT
        self.store_answered()
        if self.unreplicated:
            self.unreplicated = False
            logger.warning("celery-extras: a replica acknowledges parks again")
        if new:
            self.counts["parked"] += 1
            due = max(0.0, delay - (monotonic() - start))
            task_parked.send(sender=entry.task, request=request, due=due)
        return Park.PARKED

    def settle(
        self, eid: str, entry: Entry, delay: float, patience: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Park:  # fmt: skip
        """Park a park in doubt again, every :data:`SETTLE_EVERY` s for up to *patience* s,
        until the store answers: :attr:`Park.PARKED` (it holds the entry, from now or from
        before), else :attr:`Park.IN_DOUBT`. For a caller with no loop to come back to it (a
        retry, in the pool process that ran the task); the outage's back-off is not waited."""
        deadline = self.clock() + patience
        while self.clock() < deadline:
            sleep(SETTLE_EVERY)
            try:
                self.store.park(eid, entry, delay)
            except (ParkNotReplicated, *STORE_ERRORS):
                continue
            self.store_answered()
            return Park.PARKED
        return Park.IN_DOUBT
