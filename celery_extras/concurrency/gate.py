"""Concurrency limits enforced in the worker's main process, before a task reaches the pool.

A task with ``concurrency()`` reaches :meth:`SlotGate.submit` (after its rate
limit, if it has one). It takes a slot of its bucket (the task, or the task and
its key) and goes to the pool, or waits in the gate:

* a waiting task takes no pool slot and the prefetch window is widened for it
  (as Celery does for ETA tasks), so the tasks behind it keep flowing; its
  message stays unacked, so a worker killed meanwhile loses nothing;
* waiters of a bucket go first come first served; across workers, the store's
  tickets serve the longest-waiting worker first;
* a release wakes the waiters: at once in this worker, and through a Redis
  pub/sub notice (read by one thread, handed to the event loop through a pipe)
  in the others. A waiter also asks again when the earliest lease runs out (a
  crashed holder never releases), never on a fixed polling interval.

The slot is freed when the request ends in any way: the request gets a subclass
of its class whose ending callbacks release it (success, failure, retry,
reject, revoke, terminate, time limit), and a slot whose request Celery forgot
unseen is freed at the next renewal. The renewal (every third of the lease)
keeps the slots of running tasks alive; a worker that dies stops renewing and
its slots come back when their lease runs out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.exceptions import TaskRevokedError
from celery.worker.request import Request

from .. import compat
from ..admission.spec import call_key
from ..outage import OutageLog, store_text
from ..signals import task_concurrency_limited
from ..store import redis_client, store_key, store_url
from .redis_slots import HANDOVER_PATIENCE, SlotStore
from .slot_table import Bucket, SlotTable, WaitQueues
from .spec import ConcurrencySpec

__all__ = ["SLOTS_ATTR", "SlotConsumer", "SlotGate"]

logger = logging.getLogger(__name__)

#: Attribute of the consumer holding its :class:`SlotGate`.
SLOTS_ATTR = "extras_concurrency"
#: Longest a worker's ticket (its place in a bucket's queue) lives without renewal.
TICKET_LEASE = 3.0
#: Seconds between checks of the slots this worker holds (each renewed every third of its
#: lease, the shortest lease being 1 s).
TICK = 0.25
#: Longest a waiter goes without asking again, should every notice be lost.
MAX_RETRY = 5.0

_CLASS_MARK = "_extras_slots"
#: A notice meaning "every bucket": the listener (re)subscribed and may have missed some.
_ALL = ("", "\0all")


@dataclass
class Grant:
    """A slot held by one request: where, under which holder id, and how."""

    bucket: Bucket
    holder: str
    kind: str  # "global", "worker", "fallback" or "none" (store down, 'allow')
    lease: float
    request: Any
    renewed: float
    missing: int = 0


@dataclass
class Waiter:
    consumer: Any
    request: Any
    since: float


class SlotGate:
    """Per-worker state of the concurrency limits: specs, grants, waiters, store health."""

    def __init__(
        self, app: Celery, settings: Mapping[str, Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.app = app
        self.clock = clock
        self.on_store_error: str = settings["concurrency_on_store_error"]
        self.store_retry: float = settings["limit_store_retry"]
        self.specs: dict[str, ConcurrencySpec] = {}
        self.local = SlotTable(clock)
        self.fallback = SlotTable(clock)
        self.waiting: WaitQueues[Waiter] = WaitQueues()
        self.grants: dict[int, Grant] = {}
        self.worker = uuid.uuid4().hex[:16]
        self.counts = {"admitted": 0, "waited": 0, "released": 0, "lost_leases": 0,
                       "store_errors": 0}  # fmt: skip
        self.outage = OutageLog(logger, "concurrency slots")
        self._store: SlotStore | None = None
        self._store_known: bool | None = None
        self._down_until = 0.0
        self._retry: dict[Bucket, Any] = {}  # bucket -> timer entry of its next attempt
        #: global buckets where this worker has a ticket, and when it was last made alive
        self._tickets: dict[Bucket, float] = {}
        self._classes: dict[type, type] = {}
        self._consumer: Any = None
        self._tick_entry: Any = None
        self._listener: _Listener | None = None
        self._notices: deque[tuple[str, str]] = deque()
        self._pipe: tuple[int, int] | None = None

    # -- set-up --------------------------------------------------------------------------

    def register(self, name: str, spec: ConcurrencySpec) -> None:
        self.specs[name] = spec

    def store(self) -> SlotStore:
        if self._store is None:
            self._store = SlotStore(redis_client(self.app), store_key(self.app))
        return self._store

    def start(self, consumer: Any) -> None:
        self._consumer = consumer
        self._tick_entry = consumer.timer.call_repeatedly(TICK, self.tick, priority=6)
        hub = getattr(consumer, "hub", None)
        if hub is not None and self._pipe is None:
            read, write = os.pipe()
            os.set_blocking(read, False)
            os.set_blocking(write, False)
            self._pipe = (read, write)
            hub.add_reader(read, self._on_pipe)

    def stop(self) -> None:
        """Connection lost or shutting down: waiters are dropped (the broker delivers their
        messages again); running tasks keep their slots until they end."""
        for _bucket, waiter in self.waiting.drain():
            compat.forget_held(waiter.request)
        for entry in self._retry.values():
            entry.cancel()
        self._retry.clear()
        if self._tick_entry is not None:
            self._tick_entry.cancel()
            self._tick_entry = None
        for bucket in list(self._tickets):
            self._leave(bucket)
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        if self._pipe is not None:
            hub = getattr(self._consumer, "hub", None)
            if hub is not None:
                with contextlib.suppress(Exception):
                    hub.remove(self._pipe[0])
            for fd in self._pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._pipe = None

    # -- caps and keys ---------------------------------------------------------------------

    def cap(self, name: str) -> int:
        """The cap of *name*: the run-time one (``celery extras concurrency``) if stored."""
        spec = self.specs[name]
        if spec.scope == "worker" and not self._has_store():
            return spec.n  # no store, nothing to ask (and no outage to log)
        if self._store_up():
            try:
                stored = self.store().caps().get(name)
            except Exception as exc:
                self._store_failed(exc)
            else:
                if stored is not None:
                    return stored
        return spec.n

    def _has_store(self) -> bool:
        if self._store_known is None:
            self._store_known = store_url(self.app) is not None
        return self._store_known

    def key_of(self, name: str, spec: ConcurrencySpec, request: Any) -> str:
        return call_key(name, spec.key, request, "concurrency", "slots", logger)

    # -- taking slots ------------------------------------------------------------------------

    def submit(self, consumer: Any, request: Any, name: str) -> None:
        """A task of *name* may run: take a slot and go, or wait (FIFO per bucket)."""
        spec = self.specs[name]
        bucket = (name, self.key_of(name, spec, request))
        if not self.waiting.waiting(bucket):
            grant, retry = self._take(bucket, request, more=False)
            if grant is not None:
                self._go(consumer, request, grant)
                return
        else:
            retry = None
        self.counts["waited"] += 1
        compat.widen_prefetch(consumer)
        self.waiting.push(bucket, Waiter(consumer, request, self.clock()))
        task_concurrency_limited.send(sender=name, request=request)
        if spec.scope == "global":
            self._listen()
        if retry is not None:
            self._schedule(bucket, retry)

    def _store_up(self) -> bool:
        return self.clock() >= self._down_until

    def _take(self, bucket: Bucket, request: Any, more: bool) -> tuple[Grant | None, float]:
        """A grant for *request* in *bucket*, or ``None`` and the seconds before asking again."""
        name = bucket[0]
        spec = self.specs[name]
        holder = f"{self.worker}:{uuid.uuid4().hex[:12]}"
        cap = self.cap(name)
        now = self.clock()
        if spec.scope == "worker":
            wait = self.local.acquire(bucket, holder, cap, spec.lease)
            kind = "worker"
        else:
            if self._store_up():
                try:
                    wait = self.store().acquire(
                        name, bucket[1], holder, cap, spec.lease, self.worker, more, TICKET_LEASE
                    )
                except Exception as exc:
                    self._store_failed(exc)
                else:
                    if self.outage.down:
                        self.outage.ok()
                    if wait > 0 or more:  # waits, or was served and queued again
                        self._tickets[bucket] = now
                    else:
                        self._tickets.pop(bucket, None)
                    if wait > 0:
                        return None, min(wait, MAX_RETRY)
                    return Grant(bucket, holder, "global", spec.lease, request, now), 0.0
            if self.on_store_error == "allow":
                return Grant(bucket, holder, "none", spec.lease, request, now), 0.0
            if self.on_store_error == "delay":
                return None, self.store_retry
            wait = self.fallback.acquire(bucket, holder, cap, spec.lease)
            kind = "fallback"
        if wait > 0:
            return None, min(wait, MAX_RETRY)
        return Grant(bucket, holder, kind, spec.lease, request, now), 0.0

    def _store_failed(self, exc: BaseException) -> None:
        self.counts["store_errors"] += 1
        self._down_until = self.clock() + self.store_retry
        self.outage.failed(
            exc,
            f"global concurrency limits fall back to extras_concurrency_on_store_error="
            f"{self.on_store_error!r} until it answers",
        )

    def _go(self, consumer: Any, request: Any, grant: Grant) -> None:
        self.counts["admitted"] += 1
        self.grants[id(request)] = grant
        cls = type(request)
        releasing = self._classes.get(cls)
        if releasing is None:
            releasing = cls if cls.__dict__.get(_CLASS_MARK) else _releasing_class(cls, self)
            self._classes[cls] = self._classes[releasing] = releasing
        request.__class__ = releasing
        compat.task_reserved(request)
        consumer.on_task_request(request)

    # -- freeing slots ---------------------------------------------------------------------

    def finished(self, request: Any) -> None:
        """*request* ended (any way): free its slot and let the next waiter in."""
        grant = self.grants.pop(id(request), None)
        if grant is None or grant.request is not request:
            if grant is not None:  # not ours: put it back
                self.grants[id(request)] = grant
            return
        if grant.kind == "global" and self.waiting.waiting(grant.bucket) and self._store_up():
            if self._hand_over(grant):
                return
        else:
            self._free(grant)
        self.wake(grant.bucket)

    def _hand_over(self, grant: Grant) -> bool:
        """Free *grant*'s global slot, giving it to this worker's next waiter of the bucket
        when the store's queue allows; ``True`` when that waiter went to the pool."""
        self.counts["released"] += 1
        waiter = self.waiting.pop(grant.bucket)
        assert waiter is not None
        name, key = grant.bucket
        spec = self.specs[name]
        holder = f"{self.worker}:{uuid.uuid4().hex[:12]}"
        more = self.waiting.waiting(grant.bucket) > 0
        try:
            handed = self.store().hand_over(
                name, key, grant.holder, holder, self.cap(name), spec.lease, self.worker, more,
                HANDOVER_PATIENCE, TICKET_LEASE,
            )  # fmt: skip
        except Exception as exc:  # the old slot's lease frees it
            self._store_failed(exc)
            handed = False
        if not handed:
            self.waiting.push_front(grant.bucket, waiter)
            return False
        if more:  # the script keeps (or queues) this worker's ticket
            self._tickets[grant.bucket] = self.clock()
        else:
            self._tickets.pop(grant.bucket, None)
        compat.narrow_prefetch(waiter.consumer)
        self._go(waiter.consumer, waiter.request, Grant(
            grant.bucket, holder, "global", spec.lease, waiter.request, self.clock()
        ))  # fmt: skip
        return True

    def _free(self, grant: Grant) -> None:
        self.counts["released"] += 1
        name, key = grant.bucket
        if grant.kind == "worker":
            self.local.release(grant.bucket, grant.holder)
        elif grant.kind == "fallback":
            self.fallback.release(grant.bucket, grant.holder)
        elif grant.kind == "global":
            try:
                self.store().release(name, key, grant.holder)
            except Exception as exc:  # its lease frees it
                self._store_failed(exc)

    def wake(self, bucket: Bucket) -> None:
        """Let *bucket*'s waiters in, first come first served, while slots are free."""
        entry = self._retry.pop(bucket, None)
        if entry is not None:
            entry.cancel()
        while True:
            waiter = self.waiting.pop(bucket)
            if waiter is None:
                if bucket in self._tickets:
                    self._leave(bucket)
                return
            more = self.waiting.waiting(bucket) > 0
            grant, retry = self._take(bucket, waiter.request, more)
            if grant is None:
                self.waiting.push_front(bucket, waiter)
                self._schedule(bucket, retry)
                return
            compat.narrow_prefetch(waiter.consumer)
            self._go(waiter.consumer, waiter.request, grant)

    def _schedule(self, bucket: Bucket, seconds: float) -> None:
        if self._consumer is None:
            return
        old = self._retry.pop(bucket, None)
        if old is not None:
            old.cancel()
        self._retry[bucket] = self._consumer.timer.call_after(
            max(seconds, 0.001), self._retry_due, (bucket,), priority=6
        )

    def _retry_due(self, bucket: Bucket) -> None:
        self._retry.pop(bucket, None)
        self.wake(bucket)

    def _leave(self, bucket: Bucket) -> None:
        self._tickets.pop(bucket, None)
        if not self._store_up():
            return
        try:
            self.store().leave(bucket[0], bucket[1], self.worker)
        except Exception as exc:  # the ticket's own lease drops it
            self._store_failed(exc)

    # -- renewal ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Renew leases due (every third of the lease), keep this worker's tickets alive,
        and free slots whose request Celery forgot without an ending we saw."""
        now = self.clock()
        due: dict[Bucket, list[Grant]] = {}
        for rid, grant in list(self.grants.items()):
            if not compat.request_pending(grant.request):
                grant.missing += 1
                if grant.missing >= 2:  # gone for two ticks: its ending went unseen
                    logger.warning(
                        "celery-extras: %s[%s] ended unseen; freeing its concurrency slot",
                        grant.bucket[0], getattr(grant.request, "id", "?"),
                    )  # fmt: skip
                    del self.grants[rid]
                    self._free(grant)
                    self.wake(grant.bucket)
                    continue
            if now - grant.renewed >= grant.lease / 3:
                due.setdefault(grant.bucket, []).append(grant)
        for bucket, grants in due.items():
            self._renew(bucket, grants, now)
        if self._tickets and self._store_up():
            for bucket, touched in list(self._tickets.items()):
                if not self.waiting.waiting(bucket):
                    self._leave(bucket)
                    continue
                if now - touched < TICKET_LEASE / 3:
                    continue  # each ticket made alive once a second, not every tick
                self._tickets[bucket] = now
                try:
                    self.store().touch_ticket(bucket[0], bucket[1], self.worker, TICKET_LEASE)
                except Exception as exc:
                    self._store_failed(exc)
                    break

    def _renew(self, bucket: Bucket, grants: list[Grant], now: float) -> None:
        kind, lease = grants[0].kind, grants[0].lease
        lost: list[str] = []
        if kind == "global":
            if not self._store_up():
                return
            try:
                lost = self.store().renew(bucket[0], bucket[1], [g.holder for g in grants], lease)
            except Exception as exc:
                self._store_failed(exc)
                return
        elif kind in ("worker", "fallback"):
            table = self.local if kind == "worker" else self.fallback
            lost = [g.holder for g in grants if not table.renew(bucket, g.holder, lease)]
        for grant in grants:
            grant.renewed = now
        if lost:
            self.counts["lost_leases"] += len(lost)
            logger.error(
                "celery-extras: %d concurrency slot(s) of %s ran past their lease (%.0f s) "
                "before renewal and were reclaimed (the worker was blocked or cut off from "
                "the store); their tasks keep running",
                len(lost), bucket[0], lease,
            )  # fmt: skip

    # -- notices from other workers ----------------------------------------------------------

    def _listen(self) -> None:
        if self._listener is not None:
            return
        try:
            store = self.store()
        except Exception as exc:
            self._store_failed(exc)
            return
        self._listener = _Listener(store, self._notice_from_thread, self._all_from_thread)
        self._listener.start()

    def _notice_from_thread(self, bucket: tuple[str, str]) -> None:
        # not filtered here: a waiter refused a moment ago may not be queued yet; the
        # event loop drops notices of buckets where nothing waits
        self._notices.append(bucket)
        self._poke()

    def _all_from_thread(self) -> None:
        """(Re)subscribed: releases may have been missed, every bucket asks again."""
        self._notices.append(_ALL)
        self._poke()

    def _poke(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
                os.write(self._pipe[1], b"x")
        elif self._consumer is not None:
            self._consumer.timer.call_after(0.0, self._drain_notices, priority=6)

    def _on_pipe(self, *args: Any) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.read(self._pipe[0], 4096)
        self._drain_notices()

    def _drain_notices(self) -> None:
        seen: set[Bucket] = set()
        while self._notices:
            bucket = self._notices.popleft()
            if bucket == _ALL:
                self._notices.extend(self.waiting.buckets())
            elif bucket not in seen and self.waiting.waiting(bucket):
                seen.add(bucket)
                self.wake(bucket)

    # -- state ---------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        tasks: dict[str, dict[str, Any]] = {}
        for name, spec in self.specs.items():
            tasks[name] = {**spec.describe(), "cap": self.cap(name), "holding": 0, "waiting": 0}
        for grant in self.grants.values():
            if grant.bucket[0] in tasks:
                tasks[grant.bucket[0]]["holding"] += 1
        for bucket in self.waiting.buckets():
            if bucket[0] in tasks:
                tasks[bucket[0]]["waiting"] += self.waiting.waiting(bucket)
        return {
            "tasks": tasks,
            "holding": len(self.grants),
            "waiting": len(self.waiting),
            **self.counts,
            "store": "down" if self.outage.down else "ok",
            **({"store_error": self.outage.reason} if self.outage.down else {}),
            "on_store_error": self.on_store_error,
        }


class _Listener(threading.Thread):
    """Reads release notices from the store's pub/sub channel (one thread per worker)."""

    def __init__(
        self,
        store: SlotStore,
        on_notice: Callable[[tuple[str, str]], None],
        on_subscribed: Callable[[], None],
    ) -> None:
        super().__init__(name="celery-extras-slots", daemon=True)
        self.store = store
        self.on_notice = on_notice
        self.on_subscribed = on_subscribed
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        failed = False
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self.store.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.store.channel)
                self.on_subscribed()
                failed = False
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message and message.get("type") == "message":
                        bucket = SlotStore.parse_notice(message.get("data"))
                        if bucket is not None:
                            self.on_notice(bucket)
            except Exception as exc:
                if not failed:
                    failed = True
                    logger.warning(
                        "celery-extras: concurrency release notices lost (%s); waiters ask "
                        "again when leases run out until the store answers",
                        store_text(exc),
                    )
                self._stop.wait(1.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()


def _releasing_class(base: type[Request], gate: SlotGate) -> type[Request]:
    """A subclass of request class *base* whose endings free the request's slot."""
    base_success, base_failure = base.on_success, base.on_failure
    base_timeout, base_execute = base.on_timeout, base.execute_using_pool
    base_terminate, base_cancel = base.terminate, base.cancel

    # the task is over when its outcome reaches the main process: free the slot first,
    # so the next waiter starts while Celery acks, sends events and stores the outcome
    def on_success(self: Any, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        gate.finished(self)
        return base_success(self, failed__retval__runtime, **kwargs)

    def on_failure(self: Any, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
        gate.finished(self)
        return base_failure(self, exc_info, *args, **kwargs)

    def on_timeout(self: Any, soft: bool, timeout: Any) -> Any:
        if not soft:  # the pool kills the process: it runs no more
            gate.finished(self)
        return base_timeout(self, soft, timeout)

    # revoke with terminate, and cancel on a lost connection, kill the running process and
    # mark the request ready: no pool callback follows
    def terminate(self: Any, pool: Any, signal: Any = None) -> Any:
        running = bool(self.time_start)
        try:
            return base_terminate(self, pool, signal)
        finally:
            if running:
                gate.finished(self)

    def cancel(self: Any, pool: Any, *args: Any, **kwargs: Any) -> Any:
        running = bool(self.time_start)
        try:
            return base_cancel(self, pool, *args, **kwargs)
        finally:
            if running:
                gate.finished(self)

    def execute_using_pool(self: Any, pool: Any, **kwargs: Any) -> Any:
        try:
            return base_execute(self, pool, **kwargs)
        except (TaskRevokedError, Exception):
            gate.finished(self)  # revoked (or refused) before reaching the pool
            raise

    namespace = {
        "__slots__": (),
        _CLASS_MARK: True,
        "__module__": base.__module__,
        "__doc__": base.__doc__,
        "on_success": on_success,
        "on_failure": on_failure,
        "on_timeout": on_timeout,
        "execute_using_pool": execute_using_pool,
        "terminate": terminate,
        "cancel": cancel,
    }
    return type(base.__name__, (base,), namespace)


class SlotConsumer:
    """The consumer as a concurrency-limited task sees it: requests go through the gate."""

    def __init__(self, consumer: Any, gate: SlotGate, name: str) -> None:
        self._consumer = consumer
        self._gate = gate
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._consumer, attr)

    def on_task_request(self, request: Any) -> None:
        self._gate.submit(self._consumer, request, self._name)

    def apply_eta_task(self, request: Any) -> None:
        compat.narrow_prefetch(self._consumer)  # the strategy widened it for the ETA wait
        self._gate.submit(self._consumer, request, self._name)
