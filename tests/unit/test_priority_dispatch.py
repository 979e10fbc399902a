"""Pools without Celery's semaphore (threads, gevent, eventlet): requests beyond the pool's
``limit`` wait in priority order, the best goes when a task ends, from any thread."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from celery import Celery
from celery.concurrency.gevent import TaskPool as GeventPool
from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool as ThreadPool

import celery_extras
from celery_extras.priority.buffer import PriorityBuffer
from celery_extras.priority.dispatch import HeldDispatch
from celery_extras.priority.step import PriorityStep
from celery_extras.priority.waiting import PriorityWaiters, level_function


class Pool:
    """A pool of *limit*: records each apply's tag and callbacks; ends nothing by itself."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.applied: list[tuple[str, dict[str, Any]]] = []

    def apply_async(self, target: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        self.applied.append((args[0], options))
        return None

    def end(self, tag: str, how: str = "callback", *args: Any) -> None:
        options = next(o for t, o in self.applied if t == tag)
        options[how](*args)


class QoS:
    """kombu's window, and whether the dispatch's lock was free at each change."""

    def __init__(self) -> None:
        self.value = 4
        self.dispatch: HeldDispatch | None = None
        self.lock_free: list[bool] = []

    def _note(self) -> None:
        assert self.dispatch is not None
        free: list[bool] = []
        other = threading.Thread(target=lambda: free.append(self._try(self.dispatch)))
        other.start()
        other.join()
        self.lock_free += free

    @staticmethod
    def _try(dispatch: Any) -> bool:
        if dispatch.lock.acquire(blocking=False):
            dispatch.lock.release()
            return True
        return False

    def increment_eventually(self, n: int = 1) -> None:
        self._note()
        self.value += n

    def decrement_eventually(self, n: int = 1) -> None:
        self._note()
        self.value -= n


def request(tag: str, priority: Any) -> Any:
    return SimpleNamespace(tag=tag, delivery_info={"priority": priority, "routing_key": "q"})


def dispatch_of(limit: int = 1, extra: int | None = 100) -> tuple[HeldDispatch, Pool, QoS]:
    """A dispatch over a :class:`Pool`; Celery's ``process_task`` applies the request's
    tag, unless the request is ``revoked`` (then, as Celery's, nothing)."""
    pool, qos = Pool(limit), QoS()
    consumer = SimpleNamespace(qos=qos)
    level_of = level_function("redis", {})
    assert level_of is not None
    waiters = PriorityWaiters(PriorityBuffer(), level_of, lambda: consumer, extra)

    def process_task(req: Any) -> None:
        if not getattr(req, "revoked", False):
            pool.apply_async(None, (req.tag,), {}, callback=lambda *a: None)

    dispatch = HeldDispatch(pool, waiters, process_task, lambda: consumer)
    qos.dispatch = dispatch
    return dispatch, pool, qos


def tags(pool: Pool) -> list[str]:
    return [tag for tag, _ in pool.applied]


def test_a_task_ending_hands_the_best_held_request_to_the_pool() -> None:
    dispatch, pool, qos = dispatch_of()
    dispatch.process_task(request("first", 9))  # the pool is free: at once
    for tag, priority in [("nine", 9), ("none", None), ("two", 2), ("two-b", 2), ("zero", 0)]:
        dispatch.process_task(request(tag, priority))
    assert tags(pool) == ["first"] and dispatch.running == 1
    assert qos.value == 4 + 5  # held ones do not count against the window
    for tag in ["first", "none", "zero", "two", "two-b"]:
        pool.end(tag)
    assert tags(pool) == ["first", "none", "zero", "two", "two-b", "nine"]
    pool.end("nine")
    assert dispatch.running == 0 and qos.value == 4
    assert qos.lock_free == [True] * 10  # the window changed with the lock let go
    shown = dispatch.info()
    assert shown["served"] == 5 and shown["waiting"] == {} and shown["widened"] == 0


def test_with_two_slots_whichever_ends_frees_one() -> None:
    dispatch, pool, _ = dispatch_of(limit=2)
    for tag, priority in [("a", 5), ("b", 5), ("low", 9), ("high", 0)]:
        dispatch.process_task(request(tag, priority))
    assert tags(pool) == ["a", "b"]
    pool.end("b")
    assert tags(pool) == ["a", "b", "high"]
    dispatch.process_task(request("mid", 4))  # the pool is full: held, behind nothing better
    pool.end("a")
    pool.end("high")
    assert tags(pool) == ["a", "b", "high", "mid", "low"] and dispatch.running == 2


def test_an_arrival_does_not_overtake_better_held_requests() -> None:
    dispatch, pool, _ = dispatch_of(limit=2)
    for tag, priority in [("a", 5), ("b", 5), ("high", 0)]:
        dispatch.process_task(request(tag, priority))
    pool.limit = 3  # grown (autoscale): room, but a request waits
    dispatch.process_task(request("low", 9))
    assert tags(pool) == ["a", "b", "high"]


def test_a_request_that_never_reaches_the_pool_frees_its_slot() -> None:
    dispatch, pool, _ = dispatch_of()
    revoked = request("revoked", 0)
    revoked.revoked = True
    dispatch.process_task(revoked)  # Celery's process_task swallows TaskRevokedError
    assert dispatch.running == 0
    dispatch.process_task(request("next", 0))
    assert tags(pool) == ["next"] and dispatch.running == 1


def test_a_hard_time_limit_frees_the_slot_a_soft_one_does_not() -> None:
    dispatch, pool, _ = dispatch_of()
    heard: list[Any] = []

    def process_task(req: Any) -> None:
        pool.apply_async(None, (req.tag,), {}, callback=heard.append,
                         timeout_callback=lambda soft, s: heard.append((soft, s)))  # fmt: skip

    dispatch.process = process_task
    dispatch.process_task(request("slow", 0))
    dispatch.process_task(request("next", 0))
    pool.end("slow", "timeout_callback", True, 1.0)
    assert tags(pool) == ["slow"] and heard == [(True, 1.0)]
    pool.end("slow", "timeout_callback", False, 2.0)
    assert tags(pool) == ["slow", "next"] and heard == [(True, 1.0), (False, 2.0)]
    pool.end("slow", "callback", "late")  # a second ending frees nothing more
    assert dispatch.running == 1 and heard[-1] == "late"


def test_clear_drops_held_requests_and_running_ones_keep_their_slots() -> None:
    dispatch, pool, _ = dispatch_of()
    for tag in ["run", "held-1", "held-2"]:
        dispatch.process_task(request(tag, 0))
    dispatch.clear()  # Celery's on_close: their messages go back to the broker
    pool.end("run")
    assert tags(pool) == ["run"] and dispatch.running == 0 and len(dispatch.waiters) == 0
    assert dispatch.info()["widened"] == 0


def test_celerys_on_close_clears_it_as_the_workers_semaphore() -> None:
    """A lost connection: Celery's consumer clears the worker's semaphore, which on these
    pools is the dispatch (``hold_requests`` makes it so)."""
    from celery.worker.consumer.consumer import Consumer

    dispatch, pool, _ = dispatch_of()
    for tag in ["run", "held"]:
        dispatch.process_task(request(tag, 0))
    lost = SimpleNamespace(controller=SimpleNamespace(semaphore=dispatch), task_buckets={},
                           timer=None, pool=None)  # fmt: skip
    Consumer.on_close(lost)
    pool.end("run")
    assert tags(pool) == ["run"] and len(dispatch.waiters) == 0


def test_applies_of_others_pass_through_untouched() -> None:
    dispatch, pool, _ = dispatch_of()
    callback = object()
    pool.apply_async(None, ("batch",), {}, callback=callback)
    assert pool.applied == [("batch", {"callback": callback})] and dispatch.running == 0


def test_endings_from_pool_threads_keep_the_count() -> None:
    dispatch, pool, _ = dispatch_of(limit=4)
    for i in range(200):
        dispatch.process_task(request(str(i), i % 10))
    done = 0
    while done < 200:
        batch = tags(pool)[done:]
        threads = [threading.Thread(target=pool.end, args=(tag,)) for tag in batch]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done += len(batch)
    assert sorted(tags(pool), key=int) == [str(i) for i in range(200)]
    assert dispatch.running == 0 and len(dispatch.waiters) == 0


class Worker:
    """What the step reads of a worker."""

    def __init__(self, app: Celery, pool_cls: Any) -> None:
        self.app = app
        self.pool_cls = pool_cls
        self.pool = Pool(2)
        self.semaphore = None
        self.timer = SimpleNamespace(call_after=lambda secs, fn, args: fn(*args))
        self.process_task = self._process_task

    def _process_task(self, req: Any) -> None:
        """Celery's: straight to the pool."""


def test_the_step_holds_requests_on_threads_and_green_pools_only() -> None:
    app = celery_extras.install(Celery("t", broker="redis://"), priority=True)
    for pool_cls, holds in [(ThreadPool, True), (GeventPool, True), (SoloPool, False)]:
        worker = Worker(app, pool_cls)
        step = PriorityStep(worker)
        step.create(worker)
        assert step.info(worker)["extras_priority"]["at_dispatch"] is holds
        assert (worker.semaphore is step.dispatch is not None) is holds
        assert (worker.process_task != worker._process_task) is holds
