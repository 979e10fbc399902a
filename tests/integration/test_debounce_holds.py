"""The debounce script (``scripts/debounce.lua``) keeps the rules of the pure table: the
scenarios of ``tests/unit/test_debounce_table.py``, on a real Redis and on the 3-master
Redis Cluster, with the server's clock. No worker and no broker here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_extras.admission.notices import parse_notice
from celery_extras.debounce.redis_holds import RedisDebounce
from tests.integration.conftest import GARBAGE
from tests.support.clock import store_clock
from tests.unit.test_debounce_table import KEY, SCENARIOS, WAIT, Harness


@pytest.fixture
def holds(client: Any, store_prefix: str) -> RedisDebounce:
    return RedisDebounce(client, store_prefix)


def _harness(holds: RedisDebounce, client: Any) -> Harness:
    return Harness(holds, store_clock(client), time.sleep)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_the_script_keeps_the_rules(
    scenario: Callable[[Harness], None], holds: RedisDebounce, client: Any
) -> None:
    scenario(_harness(holds, client))
    left = {k: client.hgetall(k) for k in client.scan_iter(f"{holds.prefix}:*")}
    assert all(set(fields) <= {"n", "k", "last"} for fields in left.values()), left
    assert all(":c:" not in k and not k.endswith(":x") for k in left)  # nothing covered


def test_a_run_ending_with_a_next_message_due_publishes_its_key(
    holds: RedisDebounce, client: Any
) -> None:
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(holds.channel)
    try:
        h = _harness(holds, client)
        assert h.ask("r", "A", wait=0.01).kind == "wait"
        time.sleep(0.02)
        assert h.ask("r", "A", wait=0.01).kind == "run"
        assert h.ask("n", "B", wait=0.01).kind == "wait"
        time.sleep(0.02)
        assert holds.finish(KEY, "r", "A") is not None
        deadline = time.monotonic() + 5.0
        message = None
        while message is None and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.5)
        assert message is not None and parse_notice(message["data"]) == KEY
        assert h.ask("n", "B", wait=0.01).kind == "run"
        assert h.finish("n", "B") == []
    finally:
        pubsub.close()


def test_a_waiting_key_lives_a_day_past_its_longest_hold(holds: RedisDebounce, client: Any) -> None:
    h = _harness(holds, client)
    assert h.ask("m0", "A").kind == "wait"
    assert h.ask("m1", "A").kind == "wait"
    name = holds.hash_key(*KEY)
    assert set(client.hgetall(name)) == {"n", "k", "next", "b:m0"}
    assert 86_400_000 < client.pttl(name) <= 86_430_000  # a day + the 30 s lease
    assert client.lrange(f"{name}:c:m1", 0, -1) == ["m0"]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_in_a_key_reads_as_absent_and_heals(
    holds: RedisDebounce, client: Any, garbage: bytes
) -> None:
    """Whatever sits in a key's fields (a foreign write, a damaged restore), the script
    answers, and the key works again from its next write."""
    h = _harness(holds, client)
    name = holds.hash_key(*KEY)
    for field in ("run", "next", "o"):
        client.hset(name, field, garbage)
    assert h.ask("m0", "A").kind == "wait"
    assert h.ask("m1", "B").kind == "wait"
    time.sleep(WAIT + 0.01)
    assert h.ask("m1", "B").kind == "run"
    assert h.finish("m1", "B") == ["m0"]
    assert h.ask("m0", "A").ended
    assert set(client.hgetall(name)) == {"n", "k", "last"}
    assert 86_000_000 < client.pttl(name) <= 86_430_000  # the last run: a day (+ a lease)


def test_an_unknown_operation_is_an_error_naming_the_policy(holds: RedisDebounce) -> None:
    with pytest.raises(redis.ResponseError, match=r"^debounce: unknown operation bogus$"):
        holds._call(KEY, "bogus", "m0", "A")
