"""The admission path's lock (:mod:`celery_extras.admission.serial`): one holder at a time,
re-entrant, and work handed over (a request to the pool) done once it is let go."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from celery_extras.admission.serial import Serial, serial


class Timer:
    def __init__(self) -> None:
        self.entries: list[tuple[float, Any, tuple[Any, ...]]] = []

    def call_after(self, seconds: float, fn: Any, args: tuple[Any, ...], priority: int) -> Any:
        self.entries.append((seconds, fn, args))
        return "entry"


def test_work_handed_over_runs_after_the_outermost_holder_lets_go_in_order() -> None:
    lock, done = Serial(Timer()), []
    with lock:
        with lock:
            lock.after(done.append, 1)
        assert done == []  # still held by the outer scope
        lock.after(done.append, 2)
        assert done == []
    assert done == [1, 2]
    lock.after(done.append, 3)  # not held: at once
    assert done == [1, 2, 3]


def test_a_handover_that_raises_is_logged_and_the_rest_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lock, done = Serial(Timer()), []

    def boom() -> None:
        raise RuntimeError("pool refused")

    with caplog.at_level(logging.ERROR), lock:
        lock.after(boom)
        lock.after(done.append, "next")
    assert done == ["next"] and "handing" in caplog.text and "pool refused" in caplog.text


def test_another_thread_waits_for_the_holder_and_its_handover_is_not_taken() -> None:
    lock, seen = Serial(Timer()), []
    entered = threading.Event()

    def other() -> None:
        entered.set()
        with lock:
            seen.append("other in")
            lock.after(seen.append, "other's handover")
        seen.append("other out")

    with lock:
        thread = threading.Thread(target=other)
        thread.start()
        entered.wait(5)
        time.sleep(0.05)  # the other thread is blocked on the lock by now
        seen.append("holder")
        lock.after(seen.append, "holder's handover")
    thread.join(5)
    assert seen == ["holder", "holder's handover", "other in", "other's handover", "other out"]


def test_timer_entries_and_wrapped_calls_take_the_lock() -> None:
    timer = Timer()
    consumer = type("Consumer", (), {"timer": timer})()
    lock = serial(consumer)
    assert serial(consumer) is lock  # one per consumer
    held: list[bool] = []

    def probe(tag: str) -> str:
        held.append(lock._owner == threading.get_ident())
        return tag

    assert lock.call_after(0.5, probe, ("a",)) == "entry"
    ((seconds, fn, args),) = timer.entries
    assert seconds == 0.5 and fn(*args) == "a"
    assert lock.wrap(probe)("b") == "b"
    assert held == [True, True] and lock._owner is None
