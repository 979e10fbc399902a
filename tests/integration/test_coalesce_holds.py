"""The coalescing script (``scripts/coalesce.lua``) keeps the rules of the pure table: the
scenarios of ``tests/unit/test_coalesce_table.py``, on a real Redis and on the 3-master
Redis Cluster, with the server's clock. No worker and no broker here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_extras.coalesce.redis_holds import RedisHolds
from tests.integration.conftest import GARBAGE
from tests.support.clock import store_clock
from tests.unit.test_coalesce_table import KEY, SCENARIOS, Harness


def _harness(holds: RedisHolds, client: Any) -> Harness:
    return Harness(holds, store_clock(client), time.sleep)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_the_script_keeps_the_rules(
    scenario: Callable[[Harness], None], holds: RedisHolds, client: Any
) -> None:
    scenario(_harness(holds, client))
    leftover = {k: client.hgetall(k) for k in client.scan_iter(f"{holds.prefix}:*")}
    assert all(not any(f.startswith("b:") for f in fields) for fields in leftover.values())
    assert not [k for k in leftover if k.endswith(":x")]  # no ending context left behind


def test_an_idle_key_keeps_only_its_last_run_for_a_day(holds: RedisHolds, client: Any) -> None:
    SCENARIOS[0](_harness(holds, client))
    (key,) = list(client.scan_iter(f"{holds.prefix}:*"))
    assert set(client.hgetall(key)) == {"n", "k", "last"}
    assert 86_000_000 < client.pttl(key) <= 86_400_000


def test_the_listing_shows_running_and_waiting_runs(holds: RedisHolds, client: Any) -> None:
    h = _harness(holds, client)
    assert h.ask("r", "A").kind == "run"
    assert h.ask("w", "B", sent=h.later()).kind == "wait"
    assert h.ask("c", "B", sent=h.later()).kind == "covered"
    (one,) = list(holds.listing())
    assert (one["task"], one["key"], one["run"]["id"], one["wait"]["id"], one["covered"]) == (
        *KEY,
        "r",
        "w",
        1,
    )


def test_a_finished_run_with_a_run_waiting_publishes_its_key(
    holds: RedisHolds, client: Any
) -> None:
    from celery_extras.admission.notices import parse_notice

    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(holds.channel)
    try:
        h = _harness(holds, client)
        h.ask("r", "A")
        h.ask("w", "B", sent=h.later())
        holds.finish(KEY, "r", "A")
        deadline = time.monotonic() + 5.0
        message = None
        while message is None and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.5)
        assert message is not None and parse_notice(message["data"]) == KEY
    finally:
        pubsub.close()


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_in_a_key_reads_as_absent_and_heals(
    holds: RedisHolds, client: Any, garbage: bytes
) -> None:
    """Whatever sits in a key's fields (a foreign write, a damaged restore), the script
    answers, and the key works again from its next write."""
    h = _harness(holds, client)
    name = holds.hash_key(*KEY)
    for field in ("run", "wait", "last", "o"):
        client.hset(name, field, garbage)
    assert h.ask("m0", "A").kind == "run"
    assert h.ask("m1", "B", sent=h.now() - 5.0).kind == "covered"
    assert h.finish("m0", "A") == ["m1"]


def test_ids_covered_before_contexts_were_kept_still_end_with_their_result(
    holds: RedisHolds, client: Any
) -> None:
    """A key written by the previous release (an id covered with no context, by its script's
    very writes) ends as it did: the id comes back, with no context."""
    h = _harness(holds, client)
    assert h.ask("r", "A").kind == "run"
    name = holds.hash_key(*KEY)
    client.rpush(f"{name}:c:r", "old")  # what the previous script wrote for a covered id
    client.hset(name, "b:old", "r")
    assert h.ask("new", "B", sent=h.now() - 5.0, context="{new}").kind == "covered"
    assert h.endings("r", "A") == {"old": "", "new": "{new}"}


def test_an_unknown_operation_is_an_error_naming_the_policy(holds: RedisHolds) -> None:
    with pytest.raises(redis.ResponseError, match=r"^coalesce: unknown operation bogus$"):
        holds._call(KEY, "bogus", "m0", "A")
