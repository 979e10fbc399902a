"""Celery's in-process test worker (``celery.contrib.testing.worker.start_worker``, which
pytest-celery's in-process fixtures run too) leaves nothing of celery-extras behind.

It ends a worker with ``terminate``, not ``stop``: every step of ours must clean up on
that path too. The app has every capability on (limits, retries, concurrency slots, the
ETA store, sync, stats); its store is a private Redis, so every connection named
``celery-extras`` on it is this process's.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker

from celery_extras.store.client import CLIENT_NAME
from celery_extras.testing.worker import logging_kept
from tests.support import proj
from tests.support.brokers import PrivateRedis
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_delay", "tests.support.tasks_concurrency")
CYCLES = 20


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PrivateRedis]:
    (tmp_path / "store").mkdir()
    server = PrivateRedis(tmp_path / "store").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """The in-process worker sets up logging as a worker does (root level ``error``, a
    stderr handler): give the tests that run after it in this process theirs back."""
    with logging_kept():
        yield


def ours(client: redis.Redis) -> list[str]:
    """The store connections celery-extras holds open (this process is the only one)."""
    return [c["addr"] for c in client.client_list() if c["name"] == CLIENT_NAME]


def extras_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("extras-"))


def receivers() -> dict[str, int]:
    return {
        name: len(signal.receivers)
        for name in ("task_prerun", "task_postrun", "task_success", "task_failure",
                     "task_retry", "task_revoked", "task_rejected", "task_received")
        if (signal := getattr(signals, name, None)) is not None
    }  # fmt: skip


def test_twenty_in_process_workers_leave_no_thread_and_no_store_connection(
    broker: str, ns: str, store: PrivateRedis
) -> None:
    app = proj.make_app(broker, ns, {"extras_redis_url": store.url, "extras_eta_store": True},
                        INCLUDE)  # fmt: skip
    journal = Journal(ns)
    client = redis.Redis.from_url(store.url, decode_responses=True)
    threads_before, receivers_before = threading.active_count(), receivers()
    try:
        for cycle in range(CYCLES):
            with start_worker(app, perform_ping_check=False, shutdown_timeout=30) as worker:
                running = extras_threads()
                assert "extras-delay-mover" in running and "extras-sync" in running, running
                assert ours(client), "the worker talks to its store"
                app.send_task("tests.delay.limited10", args=(cycle,))
                app.send_task("tests.concurrency.global2", args=(cycle,), kwargs={"seconds": 0})
                wait_for(lambda n=cycle: len(journal) >= 2 * (n + 1), timeout=30,
                         what=lambda n=cycle: f"cycle {n}'s two tasks; runs so far by task: "
                         f"{dict(Counter(e['task'] for e in journal.entries()))}")  # fmt: skip
                assert worker.hostname
            wait_for(lambda: not extras_threads() and not ours(client), timeout=10,
                     what="no thread and no store connection of celery-extras")  # fmt: skip
        assert threading.active_count() <= threads_before
        assert receivers() == receivers_before
    finally:
        journal.clear()
        app.close()


def test_a_task_held_in_a_later_in_process_worker_runs(
    broker: str, ns: str, store: PrivateRedis
) -> None:
    """Each in-process worker fires its own timer: kombu before 5.6 left the first worker's
    closed event loop current, and every later worker ran on it with the first one's timer
    (its own never fired: a task held by its limit never ran, and each stop took 10 s).
    The first worker here is plain Celery's (an app without celery-extras), which leaves
    its closed loop as kombu does."""
    plain = Celery(f"{ns}-plain", broker=broker, set_as_current=False)
    plain.conf.update(task_default_queue=f"{ns}-plain", worker_hijack_root_logger=False)
    with start_worker(plain, perform_ping_check=False, shutdown_timeout=30):
        pass
    plain.close()
    app = proj.make_app(broker, ns, {"extras_redis_url": store.url}, INCLUDE)
    journal = Journal(ns)
    try:
        for cycle in range(2):
            with start_worker(app, perform_ping_check=False, shutdown_timeout=30) as worker:
                assert worker.consumer.timer is worker.hub.timer
                for tag in ("now", "held"):  # 10/s, burst 1: the second waits 0.1 s
                    app.send_task("tests.delay.limited10", args=(f"{cycle}-{tag}",))
                wait_for(lambda n=cycle: len(journal) >= 2 * (n + 1), timeout=10,
                         what=lambda n=cycle: f"cycle {n}'s runs: {journal.entries()}")  # fmt: skip
    finally:
        journal.clear()
        app.close()
