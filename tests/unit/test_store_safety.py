"""What a store's eviction policy puts at risk, read and re-read on a fake clock.

The client here answers ``INFO`` and ``CONFIG GET`` as redis-py returns them (a single
Redis, or a cluster's per-node answers); real Redis servers are in
``tests/integration/test_store_safety.py``.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from celery_extras.store.safety import (
    FULL_RECHECK,
    KEPT,
    PARKED,
    REFRESH,
    StoreSafety,
    at_risk,
)
from tests.support.clock import FakeClock


class FakeInfo:
    """``info(section)`` and ``config_get("save")`` of one Redis, or of a cluster's nodes."""

    def __init__(self, policy: str = "noeviction", *, save: str | None = "", aof: int = 0,
                 nodes: int = 0) -> None:  # fmt: skip
        self.policy, self.save, self.aof, self.nodes = policy, save, aof, nodes
        self.used = 0  # bytes of its 3 MB maxmemory in use
        self.calls = 0
        self.down = False

    def _answer(self, one: dict[str, Any]) -> dict[str, Any]:
        if not self.nodes:
            return one
        return {f"127.0.0.1:{7000 + i}": dict(one) for i in range(self.nodes)}

    def info(self, section: str) -> dict[str, Any]:
        if self.down:
            raise redis.ConnectionError("down")
        self.calls += 1
        if section == "memory":
            return self._answer(
                {"maxmemory_policy": self.policy, "maxmemory": 3 << 20, "used_memory": self.used}
            )
        return self._answer({"aof_enabled": self.aof})

    def config_get(self, name: str) -> dict[str, Any]:
        if self.save is None:
            raise redis.ResponseError("unknown command 'CONFIG'")
        return self._answer({"save": self.save})


def names(kept: tuple[Any, ...]) -> list[str]:
    return [k.what for k in kept]


def test_what_each_policy_may_evict() -> None:
    assert at_risk("noeviction") == ()
    for policy in ("allkeys-lru", "allkeys-lfu", "allkeys-random", "some-future-policy"):
        assert at_risk(policy) == KEPT
    for policy in ("volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"):
        assert names(at_risk(policy)) == [
            "retry failure memory", "concurrency slot holds", "coalescing holds"
        ]  # fmt: skip
        assert PARKED not in at_risk(policy)  # parked entries and tombstones carry no TTL


@pytest.mark.parametrize(
    ("policy", "allow", "allowed"),
    [("noeviction", False, True), ("volatile-lru", False, True), ("allkeys-lru", False, False),
     ("allkeys-lru", True, True)],
)  # fmt: skip
def test_parks_are_refused_only_where_parked_tasks_may_be_evicted(
    policy: str, allow: bool, allowed: bool
) -> None:
    safety = StoreSafety(lambda: FakeInfo(policy), allow_eviction=allow, clock=FakeClock())
    assert safety.parks_allowed() is allowed
    info = safety.info()
    assert info["policy"] == policy
    if policy == "allkeys-lru":
        assert info["parking"] == ("allowed" if allow else "refused")


def test_the_policy_is_read_again_after_refresh_and_after_a_failure() -> None:
    clock, server = FakeClock(), FakeInfo("noeviction")
    safety = StoreSafety(lambda: server, clock=clock)
    assert safety.parks_allowed() and server.calls == 2  # memory and persistence, once
    server.policy = "allkeys-lru"  # changed at run time (CONFIG SET)
    clock.now += REFRESH - 0.001
    assert safety.parks_allowed() and server.calls == 2  # not read again yet
    clock.now += 0.001
    assert not safety.parks_allowed() and server.calls == 3  # persistence is read at start only
    server.policy = "noeviction"
    safety.stale()  # a store call failed: the next connection may reach another Redis
    assert safety.parks_allowed() and server.calls == 4


def test_an_unreadable_store_leaves_parking_to_its_own_outage_handling() -> None:
    server = FakeInfo("allkeys-lru")
    server.down = True
    safety = StoreSafety(lambda: server, clock=FakeClock())
    assert safety.parks_allowed()  # the park itself then meets the outage
    assert safety.info() == {"policy": "unknown"}
    server.down = False
    assert not safety.parks_allowed()  # read at the next question, not REFRESH s later


def test_a_cluster_is_judged_by_its_worst_node() -> None:
    server = FakeInfo("noeviction", nodes=3)
    answers = server.info("memory")
    worst = next(iter(answers))
    safety = StoreSafety(lambda: server, clock=FakeClock())
    server.info = lambda section: (  # type: ignore[method-assign]
        {k: {**v, "maxmemory_policy": "allkeys-lru" if k == worst else "noeviction"}
         for k, v in answers.items()} if section == "memory" else {"n": {"aof_enabled": 0}}
    )  # fmt: skip
    assert safety.check().policy == "allkeys-lru"


@pytest.mark.parametrize(
    ("save", "aof", "persistence"),
    [("", 0, "none"), ("3600 1", 0, "rdb"), ("", 1, "aof"), ("3600 1", 1, "aof+rdb"),
     (None, 0, "unknown"), (None, 1, "aof")],
)  # fmt: skip
def test_persistence_is_read_where_config_answers(save: str | None, aof: int,
                                                  persistence: str) -> None:  # fmt: skip
    safety = StoreSafety(lambda: FakeInfo(save=save, aof=aof), clock=FakeClock())
    assert safety.check().persistence == persistence


def test_each_change_of_verdict_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    clock, server = FakeClock(), FakeInfo("allkeys-lru")
    safety = StoreSafety(lambda: server, clock=clock, logger=logging.getLogger("t"))
    with caplog.at_level(logging.WARNING, logger="t"):
        for _ in range(3):
            safety.parks_allowed()
            clock.now += REFRESH
        server.policy = "noeviction"
        for _ in range(3):
            safety.parks_allowed()
            clock.now += REFRESH
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0][0] == "ERROR"
    assert "maxmemory-policy allkeys-lru, which may evict parked tasks, revokes" in lines[0][1]
    assert "nothing is parked there" in lines[0][1] and "noeviction" in lines[0][1]
    assert lines[1] == ("WARNING", "celery-extras: the store's Redis keeps nothing on disk (no "
                        "AOF, no RDB snapshots): parked tasks, revokes and slot holds would not "
                        "survive its restart")  # fmt: skip
    assert lines[2][0] == "WARNING" and "noeviction now" in lines[2][1]


def test_a_full_store_takes_parks_again_only_below_its_headroom() -> None:
    """After a write refused for memory, parks wait until used memory is below 90 % of
    maxmemory, read at most once a second: a store at the brink does not flap."""
    clock, server = FakeClock(), FakeInfo("noeviction")
    safety = StoreSafety(lambda: server, clock=clock)
    server.used = 3 << 20
    safety.full()
    calls = server.calls
    assert safety.refusal() == "full" and server.calls == calls  # not read again at once
    clock.now += FULL_RECHECK
    server.used = int(0.95 * (3 << 20))  # a few parks taken: still at the brink
    assert safety.refusal() == "full" and server.calls == calls + 1
    clock.now += FULL_RECHECK / 2
    server.used = 1 << 20
    assert safety.refusal() == "full" and server.calls == calls + 1
    clock.now += FULL_RECHECK / 2
    assert safety.parks_allowed() and not safety.is_full
    assert "full" not in safety.info()
