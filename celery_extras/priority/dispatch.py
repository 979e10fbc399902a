"""The worker's requests held for a pool without Celery's semaphore (threads, gevent,
eventlet), and the best of them handed to the pool when a task ends.

On prefork, Celery hands a request to the pool through the worker's semaphore, whose
waiting list :mod:`.step` orders by priority. The threads pool queues whatever it is given
in its executor, and the green pools' ``spawn`` blocks the consumer until a slot frees:
either way the order is fixed as messages arrive. :class:`HeldDispatch` stands in for the
worker's ``process_task`` on those pools: it counts the requests in the pool, and one that
arrives when as many run as the pool's ``limit`` waits in a
:class:`~.waiting.PriorityWaiters` (the same list, and the same widened prefetch window, as
on prefork). When a task ends (the pool's callback, in a pool thread or greenlet) the best
waiting request goes to the pool. On a green pool every request is handed over from a
greenlet of the worker's timer: a green ``spawn`` from within an ending greenlet would wait
for that greenlet's own slot (an ending may also let a request on through the admission
pipeline, in the same greenlet), and the consumer never waits in ``spawn``. Every count is
kept under one lock, which nothing holds while the pool is called.

Requests held here do not count against the prefetch window (up to
``extras_priority_prefetch`` of them), as on prefork; the window is widened and narrowed
once the lock is let go, as kombu's ``QoS`` takes a lock of its own, which the consumer
holds while it sets the window and may read a message meanwhile.

A request that never reaches the pool (revoked while it waited, or refused) frees its slot
at once. A held request's message is unacked: when the connection closes (a lost
connection, a warm stop) Celery's ``on_close`` clears the worker's semaphore, and
:meth:`HeldDispatch.clear` is called as that semaphore, so held requests are dropped and
the broker delivers their messages again, as on prefork. From a warm stop's signal on, no
held request starts: a green pool's consumer loop sees the signal only at its next turn.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .. import compat
from .waiting import PriorityWaiters

__all__ = ["HeldDispatch", "hold_requests"]

#: ``later(fn, request)``: call ``fn(request)`` soon, out of the caller's thread or greenlet
Later = Callable[[Callable[[Any], None], Any], None]


class _Slot:
    """One request's place in the pool, freed once: by the pool's callback, a hard time
    limit, or the request never reaching the pool."""

    __slots__ = ("applied", "dispatch", "freed")

    def __init__(self, dispatch: HeldDispatch) -> None:
        self.dispatch = dispatch
        self.applied = False
        self.freed = False

    def free(self) -> None:
        with self.dispatch.lock:
            if self.freed:
                return
            self.freed = True
        self.dispatch.freed()


class _Window:
    """Stands in for the consumer to :class:`~.waiting.PriorityWaiters`: counts the widening
    (``+1``) and narrowing (``-1``) it asks for, under the dispatch's lock."""

    def __init__(self) -> None:
        self.qos = self
        self.change = 0

    def consumer(self) -> _Window:
        return self

    def increment_eventually(self, n: int = 1) -> None:
        self.change += n

    def decrement_eventually(self, n: int = 1) -> None:
        self.change -= n

    def take(self) -> int:
        change, self.change = self.change, 0
        return change


class HeldDispatch:
    """Requests for *pool* (its ``limit`` at once), the rest in *waiters* until a task ends.

    *process* is Celery's ``process_task`` (the request handed to the pool); *consumer*
    gives the worker's consumer (its window); *later* hands each request over out of the
    caller's greenlet, ``None`` to do it in the caller's thread."""

    def __init__(self, pool: Any, waiters: PriorityWaiters, process: Callable[[Any], Any],
                 consumer: Callable[[], Any], later: Later | None = None) -> None:  # fmt: skip
        self.pool = pool
        self.waiters = waiters
        self.process = process
        self.consumer = consumer
        self.later = later
        self.window = _Window()  # what waiters asks of the window, done once the lock is let go
        waiters.consumer = self.window.consumer
        self.lock = threading.RLock()
        self.running = 0
        self._local = threading.local()  # the slot of the request being handed to the pool
        self._apply = pool.apply_async
        pool.apply_async = self._apply_async

    def process_task(self, request: Any) -> None:
        """The consumer's ``on_task_request``: *request* to the pool, or held when the pool
        is full or better requests wait (then the best ones fill what room there is)."""
        with self.lock:
            if self.running < self._limit() and not len(self.waiters):
                self.running += 1
                going: list[Any] = [(self._start, (request,), {})]
            else:
                self.waiters.append((self._start, (request,), {}))
                going = self._fill()
            change = self.window.take()
        self._resize(change)
        self._hand(going)

    def freed(self) -> None:
        """A request left the pool: the best waiting ones fill the room."""
        with self.lock:
            self.running -= 1
            going = self._fill()
            change = self.window.take()
        self._resize(change)
        self._hand(going)

    def _hand(self, going: list[Any]) -> None:
        """Start each of *going* (waiters: ``(start, (request,), {})``), here or later."""
        for start, args, _ in going:
            if self.later is None:
                start(*args)
            else:
                self.later(start, *args)

    def _fill(self) -> list[Any]:
        """The best waiting requests, as many as there is room for, counted as running;
        none once the worker is told to stop (it has yet to clear them)."""
        going: list[Any] = []
        if compat.worker_stopping():  # a green pool's consumer loop sees it up to 2 s late
            return going
        while self.running < self._limit() and len(self.waiters):
            self.running += 1
            going.append(self.waiters.popleft())
        return going

    def clear(self) -> None:
        """Celery's ``on_close`` (as the worker's semaphore): held requests are dropped, the
        broker delivers their messages again; running ones keep their slots."""
        with self.lock:
            self.waiters.clear()

    def info(self) -> dict[str, Any]:
        with self.lock:
            return {**self.waiters.info(), "running": self.running}

    def _resize(self, change: int) -> None:
        consumer = self.consumer() if change else None
        qos = getattr(consumer, "qos", None)
        if qos is None:
            return
        if change > 0:
            qos.increment_eventually(change)
        else:
            qos.decrement_eventually(-change)

    def _limit(self) -> int:
        return max(1, int(getattr(self.pool, "limit", 1) or 1))

    def _start(self, request: Any) -> None:
        slot = self._local.slot = _Slot(self)
        try:
            self.process(request)
        finally:
            self._local.slot = None
            if not slot.applied:  # revoked while it waited, or refused: never in the pool
                slot.free()

    def _apply_async(self, target: Any, args: Any = None, kwargs: Any = None,
                     **options: Any) -> Any:  # fmt: skip
        """The pool's ``apply_async``: a request from :meth:`_start` frees its slot as the
        pool ends it (its callback, or a hard time limit)."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is None:  # not a request of this dispatch (e.g. a batch's body)
            return self._apply(target, args, kwargs, **options)
        self._local.slot = None
        slot.applied = True
        _free_on_end(slot, options)
        try:
            return self._apply(target, args, kwargs, **options)
        except BaseException:
            slot.free()
            raise


def _free_on_end(slot: _Slot, options: dict[str, Any]) -> None:
    """Wrap the pool's callbacks in *options* so that *slot* is freed first: the result,
    an error, or a hard time limit (a soft one leaves the task running)."""
    callback = options.get("callback")
    options["callback"] = _freeing(slot, callback)
    if options.get("error_callback") is not None:
        options["error_callback"] = _freeing(slot, options["error_callback"])
    timeout = options.get("timeout_callback")
    if timeout is not None:

        def on_timeout(soft: bool, seconds: Any) -> Any:
            if not soft:
                slot.free()
            return timeout(soft, seconds)

        options["timeout_callback"] = on_timeout


def _freeing(slot: _Slot, callback: Callable[..., Any] | None) -> Callable[..., Any]:
    def freeing(*args: Any, **kwargs: Any) -> Any:
        slot.free()
        return None if callback is None else callback(*args, **kwargs)

    return freeing


def hold_requests(worker: Any, waiters: PriorityWaiters,
                  consumer: Callable[[], Any]) -> HeldDispatch | None:  # fmt: skip
    """A :class:`HeldDispatch` as *worker*'s ``process_task`` (before its consumer is made)
    and semaphore (Celery's ``on_close`` clears it), when its pool runs tasks beside the
    consumer (threads, gevent, eventlet); ``None`` for other pools (solo runs them in it,
    prefork without its semaphore hands them straight on)."""
    pool_cls = worker.pool_cls
    if getattr(pool_cls, "uses_semaphore", False):
        return None
    green = bool(getattr(pool_cls, "is_green", False))
    if not green and not _is_threads(pool_cls):
        return None
    later = _from_timer(worker) if green else None
    dispatch = HeldDispatch(worker.pool, waiters, worker.process_task, consumer, later)
    worker.process_task = dispatch.process_task
    worker.semaphore = dispatch
    return dispatch


def _is_threads(pool_cls: Any) -> bool:
    from celery.concurrency.thread import TaskPool

    return isinstance(pool_cls, type) and issubclass(pool_cls, TaskPool)


def _from_timer(worker: Any) -> Later:
    """Hand a request to a green pool from a greenlet of the worker's timer: a ``spawn``
    from the ending greenlet would wait for that greenlet's own slot."""

    def later(fn: Callable[[Any], None], request: Any) -> None:
        worker.timer.call_after(0, fn, (request,))

    return later
