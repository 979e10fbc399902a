"""Session-wide safety net: no worker process outlives the test run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.topology import RedisClusterTopology, redis_cluster
from tests.support.workers import stop_all


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
