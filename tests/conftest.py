"""Session-wide safety net (no worker process outlives the test run), and the lock that
lets most tests run side by side under pytest-xdist while ``exclusive`` ones run alone."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.topology import RedisClusterTopology, redis_cluster
from tests.support.workers import stop_all


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that run alone go last, the minute-long scenarios at the very end: under
    pytest-xdist both processes first share the rest, then hand the lock below from one
    lone test to the next, instead of idling at every switch between the two kinds."""

    def alone(item: pytest.Item) -> int:
        return 2 if item.get_closest_marker("scenario") else int(_runs_alone(item))

    items.sort(key=alone)  # stable: collection order within each kind


def _runs_alone(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in ("exclusive", "scenario"))


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


def _flock(stack: ExitStack, path: Path, mode: int) -> None:
    handle = stack.enter_context(open(path, "a"))  # noqa: SIM115 (closed by the stack)
    fcntl.flock(handle, mode)
    stack.callback(fcntl.flock, handle, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _exclusive_or_shared(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Under pytest-xdist, a readers-writer lock over the run's processes: a test marked
    ``exclusive`` or ``scenario`` holds it alone, the others share it. Writers go through
    a turnstile first, so a stream of shared tests cannot starve an exclusive one."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    locks = tmp_path_factory.getbasetemp().parent
    alone = _runs_alone(request.node)
    with ExitStack() as stack:
        turnstile = ExitStack()
        _flock(turnstile, locks / "turnstile.lock", fcntl.LOCK_EX)
        _flock(stack, locks / "tests.lock", fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if alone:
            stack.push(turnstile)  # held until the test ends: nobody starts meanwhile
        else:
            turnstile.close()
        yield
