"""Session-wide safety net (no worker process outlives the test run), the shared brokers
started when they do not answer, and the lock that lets tests run side by side under
pytest-xdist but for those that must not."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support import shared_brokers
from tests.support.topology import RedisClusterTopology, redis_cluster
from tests.support.workers import stop_all

#: Under pytest-xdist, which kinds of test may run at the same time: ``shared`` tests beside
#: each other; ``exclusive`` tests (they measure rates or latencies a busy neighbour would
#: skew) two at a time, beside nothing else; minute-long ``scenario`` runs (a few workers at
#: a few dozen tasks a second) beside each other; a scenario marked ``exclusive`` itself
#: (nine processes, or a latency under a flood) ``alone``.
KINDS = ("shared", "exclusive", "alone", "scenario")  # the order they run in, too
CONFLICTS = {
    "shared": ("exclusive", "alone", "scenario"),
    "exclusive": ("shared", "alone", "scenario"),
    "alone": KINDS,
    "scenario": ("shared", "exclusive", "alone"),
}
#: How many tests of a kind run at once at most, whatever the number of processes: the
#: scenarios' rates were measured two at a time (``-n 3`` gives the shared tests, which
#: mostly wait on their workers, a third process); the exclusive tests' figures hold two at
#: a time (every one passed so beside another, with four more agents loading the cores).
AT_ONCE = {"exclusive": 2, "scenario": 2}


def _kind(item: pytest.Item) -> str:
    """A test's own ``exclusive`` mark wins over ``scenario`` (and makes a scenario run
    ``alone``), which wins over its module's ``exclusive``."""
    scenario = item.get_closest_marker("scenario") is not None
    if any(mark.name == "exclusive" for mark in item.own_markers):
        return "alone" if scenario else "exclusive"
    return next((k for k in ("scenario", "exclusive") if item.get_closest_marker(k)), "shared")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, ``--maxschedchunk=1`` unless given: each process holds at most
    two tests ahead, so all move through the kinds together (scenarios side by side, not
    one beside a shared test another process was handed long before). Set here, not in
    pyproject.toml's ``addopts``, which the example project's tests share without xdist."""
    if config.pluginmanager.hasplugin("xdist") and config.getoption("maxschedchunk") is None:
        config.option.maxschedchunk = 1


#: the shared brokers this session started, stopped at its end
_started: list[shared_brokers.Service] = []


def _say(session: pytest.Session, line: str) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its processes
def pytest_sessionstart(session: pytest.Session) -> None:
    """In the one process (pytest-xdist's controller, or the only one), start the shared
    Redis and RabbitMQ that do not run, as .ci/run does; nothing when both run (a RabbitMQ
    whose application a test stopped runs). A binary missing fails the session in one
    line naming the Debian packages."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    down, missing = shared_brokers.plan(
        shared_brokers.SHARED, shared_brokers.running, shared_brokers.installed
    )
    if missing:
        raise pytest.UsageError(missing)
    for service in down:
        _say(session, f"{service.name} does not answer on 127.0.0.1:{service.port}: starting it")
        try:
            shared_brokers.start(service)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            why = (getattr(exc, "stderr", None) or b"").decode().strip()
            _stop_started(session)  # no pytest_sessionfinish after a UsageError here
            raise pytest.UsageError(f"could not start {service.name}: {exc} {why}") from None
        _started.append(service)


@pytest.hookimpl(trylast=True)  # after pytest-xdist's processes ended
def pytest_sessionfinish(session: pytest.Session) -> None:
    _stop_started(session)


def _stop_started(session: pytest.Session) -> None:
    """Stop the shared brokers this session started, and only those (a session run beside
    it on the same machine loses them then: there, start the brokers beforehand)."""
    while _started:
        service = _started.pop()
        try:
            shared_brokers.stop(service)
        except (OSError, subprocess.SubprocessError) as exc:
            _say(session, f"could not stop {service.name} (started by this session): {exc}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Shared tests first, then exclusive ones, then the scenarios: under pytest-xdist the
    processes switch kinds twice, not at every other test (each switch idles one); with
    ``--maxschedchunk=1`` (:func:`pytest_configure`) both switch at about the same time."""
    items.sort(key=lambda item: KINDS.index(_kind(item)))  # stable within a kind


@pytest.fixture(scope="session", autouse=True)
def _reap_workers() -> Iterator[None]:
    yield
    stop_all()


@pytest.fixture(scope="session")
def redis_cluster_topology(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisClusterTopology]:
    """A private 3-master Redis Cluster on loopback for the whole run (stopped at its end);
    tests keep to their own key prefix on it, as on the shared Redis."""
    with redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as topology:
        yield topology


def _flock(stack: ExitStack, path: Path, mode: int) -> bool:
    """Lock *path* (``mode``: ``fcntl.LOCK_*``) until *stack* closes; False if ``LOCK_NB``
    was asked and another process holds it."""
    handle = open(path, "a")  # noqa: SIM115 (closed by the stack, or at once)
    try:
        fcntl.flock(handle, mode)
    except BlockingIOError:
        handle.close()
        return False
    stack.enter_context(handle)
    stack.callback(fcntl.flock, handle, fcntl.LOCK_UN)
    return True


def _take_a_place(stack: ExitStack, locks: Path, kind: str) -> None:
    """One of the ``AT_ONCE[kind]`` places of *kind*: the first free one, or, when all are
    taken, the first to be freed (polled: places are held for seconds to minutes)."""
    places = [locks / f"{kind}-{i}.lock" for i in range(AT_ONCE[kind])]
    while not any(_flock(stack, place, fcntl.LOCK_EX | fcntl.LOCK_NB) for place in places):
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def _kinds_apart(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Under pytest-xdist, a test holds its kind's lock shared while it runs (see ``KINDS``).
    To start, it takes the gate, waits until no test of a conflicting kind runs (its lock
    free), takes its own and lets the gate go: a waiting test holds the gate, so a stream
    of other kinds cannot starve it. Locks are ``flock``: a process that dies frees them."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    locks = tmp_path_factory.getbasetemp().parent
    kind = _kind(request.node)
    with ExitStack() as running:
        with ExitStack() as gate:
            _flock(gate, locks / "gate.lock", fcntl.LOCK_EX)
            for other in CONFLICTS[kind]:
                with ExitStack() as probe:
                    _flock(probe, locks / f"{other}.lock", fcntl.LOCK_EX)
            _flock(running, locks / f"{kind}.lock", fcntl.LOCK_SH)
            if kind in AT_ONCE:
                _take_a_place(running, locks, kind)
        yield
