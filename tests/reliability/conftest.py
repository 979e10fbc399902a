"""The reliability suite uses the integration fixtures: real workers on real brokers."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import broker, cluster, journal, ns, send, store
from tests.support.topology import SentinelTopology, redis_sentinel

__all__ = ["broker", "cluster", "journal", "ns", "send", "sentinel", "store"]


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[SentinelTopology]:
    """A private master, replica and 3 Sentinels on loopback, stopped after the test."""
    with redis_sentinel(tmp_path / "sentinel") as topology:
        yield topology
