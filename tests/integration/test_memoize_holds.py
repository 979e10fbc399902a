"""The memoize script (``scripts/memoize.lua``) keeps the rules of the pure table: the
scenarios of ``tests/unit/test_memoize_table.py``, on a real Redis with the server's clock.
No worker and no broker here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_extras.memoize.redis_memo import RedisMemo
from tests.support.brokers import REDIS_URL
from tests.support.clock import store_clock
from tests.unit.test_memoize_table import KEY, SCENARIOS, Harness


@pytest.fixture
def client() -> Any:
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


@pytest.fixture
def memo(client: Any, store_prefix: str) -> RedisMemo:
    return RedisMemo(client, store_prefix)


def _harness(memo: RedisMemo, client: Any) -> Harness:
    return Harness(memo, store_clock(client), time.sleep)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_the_script_keeps_the_rules(
    scenario: Callable[[Harness], None], memo: RedisMemo, client: Any
) -> None:
    scenario(_harness(memo, client))
    leftover = {k: client.hgetall(k) for k in client.scan_iter(f"{memo.prefix}:*")
                if client.type(k) == "hash"}  # fmt: skip
    assert all(not any(f.startswith("b:") for f in fields) for fields in leftover.values())
    assert not [k for k in leftover if k.endswith(":x")]  # no ending context left behind


def test_max_keys_bounds_the_keys_kept_in_the_store(memo: RedisMemo, client: Any) -> None:
    for i in range(5):
        memo.ask((KEY[0], str(i)), f"r{i}", "A", 30.0)
        memo.finish((KEY[0], str(i)), f"r{i}", "A", 60.0, 4)
    assert memo.kept(KEY[0]) == 4
    assert list(memo.listing(KEY[0])) == ["4", "3", "2", "1"]
    hashes = [k for k in client.scan_iter(f"{memo.prefix}:*") if not k.endswith(":lru")]
    assert len(hashes) == 4
