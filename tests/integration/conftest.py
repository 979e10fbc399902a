"""Fixtures for tests against real brokers and real ``celery worker`` processes.

``broker`` is parametrized over Redis and RabbitMQ (a missing broker fails the
test, it is never skipped). ``ns`` isolates one test's queues, exchanges and
store keys. ``cluster`` holds a test's app and workers: ``cluster.configure(**conf)``
sets the app's configuration and ``cluster.worker(...)`` starts workers that build
the very same app. ``restartable_cluster`` puts a cluster on a broker the test may
stop and restart. ``store`` says where the shared store lives: ``"default"`` (the
broker's Redis, else the result backend's) or ``"redis-cluster"`` (the private
3-master Redis Cluster); tests marked with :func:`also_on_redis_cluster` run once
more with the store on the cluster.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from celery import Celery

from celery_extras.coalesce.redis_holds import RedisHolds
from celery_extras.stats.listener import ClusterState, Listener
from tests.support import proj
from tests.support.brokers import REDIS_URL, Restartable, require_broker, restartable_broker
from tests.support.journal import Journal
from tests.support.topology import RedisClusterTopology
from tests.support.workers import WorkerProcess, wait_for


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> str:
    """URL of a real broker; the test runs once on Redis and once on RabbitMQ."""
    return require_broker(request.param)


@pytest.fixture(params=["redis", "redis-cluster"])
def client(request: pytest.FixtureRequest) -> Any:
    """A store client (``decode_responses``): the shared Redis, then the private 3-master
    Redis Cluster, for the store's script tests (a module may define its own ``client``)."""
    if request.param == "redis-cluster":
        topology: RedisClusterTopology = request.getfixturevalue("redis_cluster_topology")
        return topology.client()
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


STORES = ("default", "redis-cluster")


@pytest.fixture
def store_prefix(client: Any) -> Iterator[str]:
    """A key prefix of the test's own on *client*: its keys are removed after the test."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield prefix
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


@pytest.fixture
def holds(client: Any, store_prefix: str) -> RedisHolds:
    """Coalescing's store part on *client*, under a prefix of its own; a module may define
    its own ``holds`` (debounce's, memoize's)."""
    return RedisHolds(client, store_prefix)


#: What a foreign write or a damaged restore may leave in a key run's fields.
GARBAGE = (b"\xff not json", b"[1, 2]", b'{"id": 5, "u": "x"}', b'"text"', b"{}", b"null")


def also_on_redis_cluster(broker: str) -> pytest.MarkDecorator:
    """Run the test on both brokers with the default store, and once more with the store on
    the 3-master Redis Cluster and the broker *broker* (once, not per broker: CI time)."""
    return pytest.mark.parametrize(
        ("broker", "store"),
        [("redis", "default"), ("rabbitmq", "default"), (broker, "redis-cluster")],
        indirect=True,
        ids=["redis", "rabbitmq", f"{broker}-store-on-redis-cluster"],
    )


@pytest.fixture
def store(request: pytest.FixtureRequest) -> str:
    """Where the shared store lives (see the module docstring): ``"default"`` unless marked,
    or unless ``EXTRAS_TEST_STORE=redis-cluster`` puts every test's store on the cluster
    (``EXTRAS_TEST_STORE=redis-cluster pytest tests/integration/test_sync.py``)."""
    kind: str = getattr(request, "param", os.environ.get("EXTRAS_TEST_STORE", "default"))
    assert kind in STORES, kind
    return kind


@pytest.fixture
def ns() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def journal(ns: str) -> Iterator[Journal]:
    log = Journal(ns)
    yield log
    log.clear()


class Cluster:
    """The test-side app and the workers of one test, all on one broker and namespace."""

    def __init__(self, broker: str, ns: str, logdir: Path) -> None:
        self.broker = broker
        self.ns = ns
        self.logdir = logdir
        self.conf: dict[str, Any] = {}
        self.include: tuple[str, ...] = ()
        self.plain = False
        self.workers: list[WorkerProcess] = []
        self._app: Celery | None = None

    def configure(self, include: tuple[str, ...] = (), plain: bool = False, **conf: Any) -> Celery:
        """Set the app's settings and task modules (before starting workers).

        *plain* runs plain Celery, without celery-extras, for side-by-side comparisons.
        """
        self.conf.update(conf)
        self.include = include
        self.plain = plain
        if self._app is not None:
            self._app.close()
        self._app = None
        return self.app

    @property
    def app(self) -> Celery:
        if self._app is None:
            self._app = proj.make_app(self.broker, self.ns, self.conf, self.include, self.plain)
        return self._app

    def worker(self, name: str = "w1", start: bool = True, **kwargs: Any) -> WorkerProcess:
        env = proj.worker_env(self.broker, self.ns, self.conf, self.include, self.plain)
        worker = WorkerProcess(name, env, self.logdir / f"{name}.log", **kwargs)
        self.workers.append(worker)
        return worker.start() if start else worker

    def ask(self, worker: WorkerProcess, command: str, **arguments: Any) -> Any:
        """Send one control command to *worker* and return its answer (None if none came).

        The broadcast returns at the first reply; the deadline is generous because a loaded
        machine (two suites' workers on two cores) can take seconds to answer a large one.
        """
        replies = self.app.control.broadcast(
            command, arguments=arguments, reply=True, timeout=30, limit=1,
            destination=[worker.hostname],
        )  # fmt: skip
        return replies[0][worker.hostname] if replies else None

    def stats(self, hostname: str) -> dict[str, Any]:
        """Worker *hostname*'s ``inspect stats`` reply (empty when it did not answer in
        time)."""
        stats = self.app.control.inspect(destination=[hostname], timeout=5).stats() or {}
        return dict(stats.get(hostname) or {})

    def stop(self) -> None:
        """After the test: SIGKILL its workers (each in its own process group, pool and all).

        The test has asserted what it needed and its queues and store keys are its own
        namespace's, so nothing is left to drain: a warm shutdown would only cost Celery
        its 2.6 s per worker (1.7 s cold), several minutes over the suite. A test that
        checks a shutdown stops its worker itself.
        """
        for worker in self.workers:
            worker.stop(timeout=0)
        if self._app is not None:
            self._app.close()


@pytest.fixture
def cluster(
    broker: str, store: str, ns: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    """A namespaced app on the parametrized broker; its workers are stopped after the test."""
    c = Cluster(broker, ns, tmp_path)
    if store == "redis-cluster":
        topology: RedisClusterTopology = request.getfixturevalue("redis_cluster_topology")
        c.conf["extras_redis_url"] = topology.url
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def listening(cluster: Cluster) -> Iterator[ClusterState]:
    """The cluster's ``worker-throughput`` events, as a listener consuming them has them."""
    state = ClusterState()
    listener = Listener(cluster.app, state, wakeup=False)
    listener.start()
    try:
        wait_for(listener.ready.is_set, timeout=30, what="event listener consuming")
        yield state
    finally:
        listener.stop()


@pytest.fixture
def send(cluster: Cluster) -> Callable[..., Any]:
    """``send(name, *args, **options)``: publish a task by name to the test app."""

    def send_task(name: str, *args: Any, **options: Any) -> Any:
        return cluster.app.send_task(name, args=args, **options)

    return send_task


@contextmanager
def workers_for_module(broker: str, workdir: Path, include: tuple[str, ...],
                       **conf: Any) -> Iterator[Cluster]:  # fmt: skip
    """Two workers (``w1``, ``w2``) of *include* on *broker* with *conf*, started together,
    for a whole test module (each test on keys of its own); its journal cleared after."""
    cluster = Cluster(require_broker(broker), f"t{uuid.uuid4().hex[:10]}", workdir)
    cluster.configure(include=include, **conf)
    try:
        for name in ("w1", "w2"):
            cluster.worker(name, start=False).start(wait=False)
        for worker in cluster.workers:
            worker.wait_ready()
        yield cluster
    finally:
        cluster.stop()
        Journal(cluster.ns).clear()


@contextmanager
def restartable_cluster(kind: str, ns: str, workdir: Path) -> Iterator[tuple[Cluster, Restartable]]:
    """A cluster on a broker the test may stop and restart (see ``restartable_broker``);
    its workers are stopped, and the broker is running again, afterwards."""
    with restartable_broker(kind, workdir) as broker:
        cluster = Cluster(broker.url, ns, workdir)
        try:
            yield cluster, broker
        finally:
            cluster.stop()


#: kombu 5.7 restores a dead worker's unacked Redis messages every
#: ``unacked_restore_interval``; earlier releases only when a worker starts (then every
#: ~100 s).
KOMBU_RESTORES_PERIODICALLY = tuple(map(int, kombu.__version__.split(".")[:2])) >= (5, 7)


#: kombu's Redis transport restores unacked messages under a mutex that expires after
#: ``unacked_mutex_expire`` (300 s): a worker SIGKILLed while it restores leaves the mutex
#: held, and no worker restores anything for 5 minutes (seen in the herd test: 163 released
#: messages still unacked 4 minutes after the kills, the mutex held). The SIGKILL tests,
#: whose visibility timeouts are seconds, let it expire in as many.
MUTEX_EXPIRE = 10

#: Transport options of the SIGKILL tests: Redis gives a dead worker's messages back after
#: 8 s (the unacked_* keys are namespaced by make_app).
RESTORE_AFTER_8S = {
    "visibility_timeout": 8,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
    "unacked_mutex_expire": MUTEX_EXPIRE,
}


def wait_until_unacked_due(
    cluster: Cluster, visibility_timeout: float = RESTORE_AFTER_8S["visibility_timeout"]
) -> bool:
    """On a Redis broker with kombu < 5.7, wait until a dead worker's unacked messages are
    past *visibility_timeout*, so that a worker started now restores them all; say whether
    it waited (a worker must then be started for them)."""
    if not cluster.broker.startswith("redis") or KOMBU_RESTORES_PERIODICALLY:
        return False
    index = redis.Redis.from_url(cluster.broker)

    def all_due() -> bool:
        delivered = index.zrange(f"{cluster.ns}.unacked_index", 0, -1, withscores=True)
        return all(at < time.time() - visibility_timeout - 1 for _, at in delivered)

    wait_for(all_due, timeout=30, interval=0.5, what="the unacked messages to be due")
    return True
