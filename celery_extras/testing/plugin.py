"""The pytest plugin of celery-extras (entry point ``pytest11``): fixtures to test tasks with
limits, retry policies, concurrency caps and coalescing, in simulated time.

* ``extras_store``: a clean Redis store for the test (a namespace of its own on the
  session's embedded server, or on ``--extras-redis-url``).
* ``extras_app``: pytest-celery's ``celery_app`` (with ``celery_config`` and
  ``@pytest.mark.celery``) with celery-extras installed, its broker the store's Redis unless
  the test configures one.
* ``extras_clock``: a :class:`~.clock.SimulatedClock` every celery-extras clock reads.
* ``extras_worker``: an in-process worker of ``extras_app`` (Celery's ``start_worker``),
  stopped with nothing left running; ``extras_worker_parameters`` sets its pool.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import set_event_loop

import celery_extras

from .. import clock as clocks
from .. import compat
from .clock import SimulatedClock
from .embedded import EmbeddedRedis
from .worker import SettlingWorker, logging_kept

__all__ = [
    "SIMULATED_SETTINGS",
    "ExtrasStore",
    "extras_app",
    "extras_clock",
    "extras_store",
    "extras_worker",
    "extras_worker_parameters",
]

#: What ``extras_clock`` sets on ``extras_app`` (unless the test sets them): every wait is
#: parked in the delay store, the one thing simulated time releases, and released on time.
SIMULATED_SETTINGS = {
    "extras_delay_max_hold": 0.0,
    "extras_delay_lead": 0.0,
    "extras_delay_lookahead": 0.0,
    "extras_eta_store": True,
    "extras_eta_threshold": 0.0,
}
_numbers = itertools.count(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--extras-redis-url",
        default=None,
        help="Redis for celery-extras' test fixtures (default: an embedded redis-server per "
        "test process); each test gets a namespace of its own on it",
    )


@dataclass(frozen=True)
class ExtrasStore:
    """The test's store: its Redis URL, its key namespace, and a client for assertions."""

    url: str
    namespace: str
    client: redis.Redis


@pytest.fixture(scope="session")
def _extras_redis_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    given = request.config.getoption("--extras-redis-url")
    if given:
        yield str(given)
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("extras-redis")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def extras_store(_extras_redis_url: str) -> Iterator[ExtrasStore]:
    """A clean store: a namespace no other test (nor xdist process) uses, emptied after."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    namespace = f"extras-test-{worker}-{os.getpid()}-{next(_numbers)}"
    client = redis.Redis.from_url(_extras_redis_url, decode_responses=True)
    try:
        yield ExtrasStore(_extras_redis_url, namespace, client)
    finally:
        try:
            keys = list(client.scan_iter(match=f"*{namespace}*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        finally:
            client.close()


@pytest.fixture
def extras_clock() -> Iterator[SimulatedClock]:
    """Simulated time, read by every celery-extras clock until the test ends."""
    clock = SimulatedClock()
    clocks.simulate(clock)
    try:
        yield clock
    finally:
        clocks.simulate(None)


def _given(request: pytest.FixtureRequest, celery_config: dict[str, Any]) -> set[str]:
    """The settings the test chose itself (``celery_config`` and ``@pytest.mark.celery``)."""
    mark = request.node.get_closest_marker("celery")
    return {*celery_config, *(mark.kwargs if mark else {})}


@pytest.fixture
def extras_app(
    request: pytest.FixtureRequest,
    celery_app: Celery,
    celery_config: dict[str, Any],
    extras_store: ExtrasStore,
) -> Celery:
    """``celery_app`` with celery-extras installed on its store (and, by default, broker),
    current and default."""
    given = _given(request, celery_config)
    ours: dict[str, Any] = {
        "extras_redis_url": extras_store.url,
        "extras_key_prefix": extras_store.namespace,
    }
    if not given & {"broker_url", "broker"}:
        ours["broker_url"] = extras_store.url
        ours["broker_transport_options"] = {
            "global_keyprefix": f"{extras_store.namespace}:",
            # a worker's BRPOP waits this long: its stop waits for the last one to return
            "polling_interval": 0.1,
        }
    if "extras_clock" in request.fixturenames:
        clock = request.getfixturevalue("extras_clock")
        ours.update(SIMULATED_SETTINGS)
        _simulated_now(celery_app, clock)
    if "extras_limit_max_hold" in given:  # the test set it under its former name
        given = given | {"extras_delay_max_hold"}
    celery_app.conf.update({k: v for k, v in ours.items() if k not in given})
    celery_extras.install(celery_app)
    # current and default, so that @shared_task tasks are its own (celery_app restores the
    # previous ones when the test ends)
    celery_app.set_current()
    celery_app.set_default()
    return celery_app


def _simulated_now(app: Celery, clock: SimulatedClock) -> None:
    """Countdowns become ETAs on the simulated clock (Celery reads ``app.now()``)."""
    utc = app.conf.enable_utc

    def now() -> datetime:
        return datetime.fromtimestamp(clock.wall(), UTC if utc else None)

    app.now = now


@pytest.fixture
def extras_worker_parameters() -> dict[str, Any]:
    """Arguments of Celery's ``start_worker`` for ``extras_worker``: override to change the
    pool. A thread pool by default, so a concurrency cap below 4 has something to cap."""
    return {"pool": "threads", "concurrency": 4}


@pytest.fixture
def extras_worker(
    request: pytest.FixtureRequest,
    extras_app: Celery,
    extras_worker_parameters: dict[str, Any],
) -> Iterator[Any]:
    """An in-process worker of ``extras_app`` with every celery-extras step; stopped (its
    threads and store connections closed) when the test ends, however it ends."""
    parameters = {"perform_ping_check": False, "shutdown_timeout": 30.0,
                  **extras_worker_parameters}  # fmt: skip
    clock: SimulatedClock | None = None
    if "extras_clock" in request.fixturenames:
        clock = request.getfixturevalue("extras_clock")
    settling: SettlingWorker | None = None
    # a worker takes kombu's current event loop if there is one, with the timer of the worker
    # that made it (kombu 5.5: the timer entries of every later worker never fire): each
    # worker gets its own, and leaves none behind
    set_event_loop(None)
    try:
        with logging_kept(), start_worker(extras_app, **parameters) as worker:
            settling = SettlingWorker(extras_app, worker)
            if clock is not None:
                clock.attach(settling)
            try:
                yield worker
            finally:
                if clock is not None:
                    clock.detach(settling)
                settling.end()
        compat.stop_pool_threads(worker.pool)
    finally:
        if settling is not None:
            settling.close()
        set_event_loop(None)
