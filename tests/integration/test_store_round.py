"""One round trip for a task's gates (``admission/store_round.py``): the real scripts of the
coalescing hold, the global limit and the global slot, composed into one script, on a real
Redis and on the 3-master Redis Cluster. A round asks each gate in order while the one
before lets the task on, and the store's state after it is what the three calls made one
after the other leave. No worker and no broker here."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from celery_extras.admission.store_round import StoreCall, StoreRound, answered
from celery_extras.coalesce.redis_holds import RedisHolds
from celery_extras.concurrency.redis_slots import RedisSlots
from celery_extras.limits.redis_bucket import GlobalTokenBucket, LimitTake
from tests.support.workers import wait_for

TASK = "tests.round.task"


@dataclass
class Gates:
    """The three stores of one test, under a prefix of its own."""

    client: Any
    prefix: str
    holds: RedisHolds
    buckets: GlobalTokenBucket
    slots: RedisSlots
    round: StoreRound

    def calls(self, mid: str, key: str, rate: float, cap: int, later: float = 0.0
              ) -> list[StoreCall]:  # fmt: skip
        """Message *mid* of coalescing key *key* (sent *later* s from now): the hold's ask,
        the limit's booking (*rate*, burst 1), the slot's take (*cap*), as the gates hand
        them over on arrival."""
        take = LimitTake(f"{TASK}:0", "", rate, 1, 1, False)
        sent = time.time() + later
        return [
            self.holds.ask_call((TASK, key), mid, sent, f"w:{mid}", 30.0, "last", 0, ""),
            self.buckets.acquire_call(TASK, [take]),
            self.slots.acquire_call(TASK, "", f"w:{mid}", cap, 30.0, "w", False, 3.0),
        ]

    def store_clock(self) -> int:
        """The store's clock (us), the one the limit's script books by."""
        seconds, micros = self.client.time()
        return int(seconds) * 1_000_000 + int(micros)

    def holders(self) -> int:
        return int(self.client.zcard(self.slots.keys(TASK)[0]))

    def booked_until(self) -> int:
        """The limit bucket's stored arrival time (us), 0 when nothing is booked."""
        key = self.buckets.bucket_key(f"{TASK}:0")
        return int(self.client.get(key) or 0)


@pytest.fixture
def gates(client: Any) -> Iterator[Gates]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    cluster = isinstance(client, redis.RedisCluster)
    yield Gates(client, prefix, RedisHolds(client, prefix), GlobalTokenBucket(client, prefix),
                RedisSlots(client, prefix), StoreRound(lambda: (client, cluster)))  # fmt: skip
    for node_key in client.scan_iter(f"{prefix}:*"):
        client.delete(node_key)


def test_a_round_asks_each_gate_in_order_and_stops_at_the_first_that_holds_back(
    gates: Gates, client: Any
) -> None:
    if isinstance(client, redis.RedisCluster):
        pytest.skip("the three gates' keys lie in three slots of a cluster: no round there")
    first = gates.round.run(gates.calls("m1", "k", 1000.0, 1))
    assert [first[0][0], first[1][0], first[2][0]] == ["run", 0, 1]
    booked, held = gates.booked_until(), gates.holders()
    assert booked > 0 and held == 1

    # the same key while m1 runs: coalescing makes m2 wait; no token, no slot taken
    second = gates.round.run(gates.calls("m2", "k", 1000.0, 1, later=1.0))
    assert len(second) == 1 and second[0][0] == "wait"
    assert (gates.booked_until(), gates.holders()) == (booked, held)

    # another key: the hold passes, the limit too (once the store's clock passed m1's
    # booking, a millisecond at 1,000/s), the slot (m1 holds the one) does not
    wait_for(lambda: gates.store_clock() > booked, timeout=5, what="m1's booking to pass")
    third = gates.round.run(gates.calls("m3", "other", 1.0, 1))
    assert [len(third), third[0][0], third[1][0], third[2][0]] == [3, "run", 0, 0]
    booked = gates.booked_until()

    # a third key at once: the limit (1/s, burst 1, m3 took it) makes it wait, booking the next
    # slot, a second later, for it to run then; the slot is not asked (cap 2: it would be)
    fourth = gates.round.run(gates.calls("m4", "third", 1.0, 2))
    assert len(fourth) == 2 and fourth[0][0] == "run" and int(fourth[1][0]) > 0
    assert (gates.booked_until() - booked, gates.holders()) == (1_000_000, 1)

    # what each gate reads of its reply is what its own call would have answered
    assert RedisHolds.verdict(fourth[0]).kind == "run"
    assert RedisSlots.acquired(first[2]) == 0.0


def test_endings_in_one_round_free_the_hold_and_the_slot(gates: Gates, client: Any) -> None:
    if isinstance(client, redis.RedisCluster):
        pytest.skip("the hold's and the slot's keys lie in two slots of a cluster: no round")
    gates.round.run(gates.calls("m1", "k", 1000.0, 1))
    covered = gates.round.run(gates.calls("m2", "k", 1000.0, 1, later=1.0))
    assert covered[0][0] == "wait"
    endings = [gates.holds.finish_call((TASK, "k"), "m1", "w:m1"),
               gates.slots.release_call(TASK, "", "w:m1")]  # fmt: skip
    finished, released = gates.round.run(endings)
    assert gates.holds.finished((TASK, "k"), finished) is not None
    assert int(released[0]) == 1 and gates.holders() == 0
    # m2, the waiting run, now runs
    again = gates.round.run(gates.calls("m2", "k", 1000.0, 1, later=1.0))
    assert RedisHolds.verdict(again[0]).kind == "run"


def test_calls_join_a_round_only_when_their_keys_share_a_slot_of_a_cluster(
    gates: Gates, client: Any
) -> None:
    calls = gates.calls("m1", "k", 1000.0, 1)
    assert gates.round.joinable(calls) is not isinstance(client, redis.RedisCluster)
    assert gates.round.joinable(calls[:1]) is False  # one call: no round
    same_slot = [gates.slots.acquire_call(TASK, "", f"w:{i}", 5, 30.0, "w", False, 3.0)
                 for i in range(2)]  # fmt: skip
    assert gates.round.joinable(same_slot) is True


def test_a_round_that_fails_hands_each_gate_its_error(gates: Gates) -> None:
    broken = StoreCall(gates.slots._acquire, tuple(gates.slots.keys(TASK)), ("x",) * 6,
                       "reply[1] == 1")  # fmt: skip

    class Asker:
        def __init__(self, label: str) -> None:
            self.label = label

        def arrival_call(self, ticket: Any) -> StoreCall:
            return broken

    @dataclass
    class Ticket:
        replies: dict[str, Any]

    ticket = Ticket({})
    gates.round.ask(ticket, [Asker("a"), Asker("b")], "arrival_call")
    assert set(ticket.replies) == {"a", "b"}
    with pytest.raises(redis.ResponseError):
        answered(ticket.replies["a"])
