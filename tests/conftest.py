"""Session-wide safety net: no worker process outlives the test run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.workers import stop_all


@pytest.fixture(scope="session", autouse=True)
def _reap_workers() -> Iterator[None]:
    yield
    stop_all()
