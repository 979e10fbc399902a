"""The delay store's rules on a fake clock: park, claim with leases, release, take once.

The same contract runs against Redis in ``tests/integration/test_delay_store.py``.
"""

from __future__ import annotations

import base64
import itertools
import json

import pytest

from celery_extras.delay.entry import Entry, entry_id
from celery_extras.delay.memory_store import MemoryDelayStore
from celery_extras.delay.mover import Mover
from celery_extras.delay.store import Claim, TakeStatus
from tests.support.clock import FakeClock


def make_entry(task_id: str = "t1", kind: str = "limit", body: bytes = b"[[1], {}, {}]") -> Entry:
    return Entry(
        task="tasks.add",
        task_id=task_id,
        kind=kind,
        body=body,
        content_type="application/json",
        content_encoding="utf-8",
        headers={"id": task_id, "task": "tasks.add", "retries": 0},
        properties={"correlation_id": task_id, "priority": 0, "delivery_mode": 2},
        exchange="q",
        routing_key="q",
        queue="q",
    )


def tokens(n: int, start: int = 0) -> list[str]:
    return [f"tok{i}" for i in range(start, start + n)]


def test_entry_round_trips_as_json_with_binary_bodies_in_base64() -> None:
    text = make_entry()
    assert Entry.loads(text.dumps()) == text
    assert '"t":' not in text.dumps() and '"i":' not in text.dumps()  # in its headers
    text.headers = {"retries": 0}  # no task name or id in the headers: they are kept
    assert Entry.loads(text.dumps()) == text and '"t":"tasks.add","i":"t1"' in text.dumps()
    binary = make_entry(body=b"\xff\x00\xfe")
    assert json.loads(binary.dumps())["b"] == "/wD+" and '"b64":1' in binary.dumps()
    assert Entry.loads(binary.dumps()) == binary


@pytest.mark.parametrize("body", [b"[[1], {}, {}]", b"\xff\x00\xfe"])
def test_entries_parked_by_earlier_releases_are_read(body: bytes) -> None:
    """Version 1, the format before the store was sharded (names spelt out)."""
    entry = make_entry(body=body)
    text = body.decode("utf-8") if body.isascii() else base64.b64encode(body).decode()
    version_1 = json.dumps({
        "v": 1, "task": entry.task, "id": entry.task_id, "kind": entry.kind, "body": text,
        "body_encoding": "utf-8" if body.isascii() else "base64",
        "content_type": entry.content_type, "content_encoding": entry.content_encoding,
        "headers": entry.headers, "properties": entry.properties, "exchange": entry.exchange,
        "routing_key": entry.routing_key, "queue": entry.queue,
    })  # fmt: skip
    assert Entry.loads(version_1) == entry
    assert len(entry.dumps()) < len(version_1) - 60


@pytest.mark.parametrize(
    "raw", ["", "[]", '{"v": 2}', '{"v": 3}', '{"v": 1, "body": 1}', '{"v": 2, "b": 1}', "null"]
)
def test_invalid_entries_are_refused_with_value_error(raw: str) -> None:
    with pytest.raises(ValueError, match="stored delay entry is not valid"):
        Entry.loads(raw)


def test_transport_properties_are_not_kept() -> None:
    entry = make_entry()
    entry.properties["delivery_tag"] = "abc"
    assert "delivery_tag" not in Entry.loads(entry.dumps()).properties


def test_entry_ids_are_derived_from_the_message() -> None:
    assert entry_id("t1", 0, "limit") == entry_id("t1", 0, "limit")
    ids = {entry_id("t1", 0, "limit"), entry_id("t1", 1, "limit"), entry_id("t1", 0, "retry"),
           entry_id("t1", 0, "limit", "e0"), entry_id("t2", 0, "limit")}  # fmt: skip
    assert len(ids) == 5


def test_park_is_idempotent_and_claim_waits_for_due_minus_lead() -> None:
    clock = FakeClock()
    store = MemoryDelayStore(clock)
    assert store.park("e1", make_entry(), 10.0) is True
    assert store.park("e1", make_entry(), 99.0) is False  # the same message parked twice
    assert store.depth() == 1
    claimed = store.claim(1.0, 5.0, tokens(10))
    assert claimed.items == [] and claimed.next_in == 10.0
    clock.now += 8.9
    assert store.claim(1.0, 5.0, tokens(10)).items == []
    clock.now += 0.2
    (item,) = store.claim(1.0, 5.0, tokens(10)).items
    assert (item.entry_id, item.token, item.attempt) == ("e1", "tok0", 1)
    assert item.due_in == pytest.approx(0.9)
    assert Entry.loads(item.raw) == make_entry()


def test_a_claim_is_exclusive_until_its_lease_ends_then_claimed_again() -> None:
    clock = FakeClock()
    store = MemoryDelayStore(clock)
    store.park("e1", make_entry(), 0.0)
    (first,) = store.claim(0.0, 5.0, tokens(1)).items
    assert store.claim(0.0, 5.0, tokens(1, 1)).items == []  # another mover gets nothing
    clock.now += 5.0  # the first mover died: its lease ended
    (second,) = store.claim(0.0, 5.0, tokens(1, 2)).items
    assert (second.token, second.attempt) == ("tok2", 2)
    assert first.token != second.token


def test_release_then_recheck_publishes_again_if_no_worker_took_it() -> None:
    clock = FakeClock()
    store = MemoryDelayStore(clock)
    store.park("e1", make_entry(), 0.0)
    (item,) = store.claim(0.0, 5.0, tokens(1)).items
    assert store.release("e1", item.token, 60.0) is True
    clock.now += 59.0
    assert store.claim(0.0, 5.0, tokens(1, 1)).items == []
    clock.now += 1.0
    assert [c.attempt for c in store.claim(0.0, 5.0, tokens(1, 1)).items] == [2]
    assert store.release("e1", "tok0", 60.0) is False  # an older claim cannot release


def test_take_runs_the_first_copy_once_and_drops_duplicates() -> None:
    clock = FakeClock()
    store = MemoryDelayStore(clock)
    store.park("e1", make_entry(), 2.0)
    (first,) = store.claim(2.0, 0.5, tokens(1)).items  # published, then the mover died
    clock.now += 0.5
    (second,) = store.claim(2.0, 0.5, tokens(1, 1)).items  # lease ended: published again
    taken = store.take("e1", "t1", second.token)
    assert (taken.status, taken.due_in, taken.kind) == (TakeStatus.TAKEN, 1.5, "limit")
    assert store.take("e1", "t1", first.token).status is TakeStatus.DUPLICATE
    assert store.take("e1", "t1", second.token).status is TakeStatus.REDELIVERED
    assert store.depth() == 0
    assert store.claim(10.0, 5.0, tokens(1, 2)).items == []  # taken: never published again
    assert store.release("e1", second.token, 1.0) is False


@pytest.mark.parametrize(
    ("entry", "task_id", "token"),
    [("e1", "t1", "forged"), ("e1", "other-task", "tok0"), ("nope", "t1", "tok0")],
)
def test_forged_or_unknown_messages_are_not_booked(entry: str, task_id: str, token: str) -> None:
    store = MemoryDelayStore(FakeClock())
    store.park("e1", make_entry(), 0.0)
    store.claim(0.0, 5.0, tokens(1))
    assert store.take(entry, task_id, token).status is TakeStatus.UNKNOWN
    assert store.take("e1", "t1", "tok0").status is TakeStatus.TAKEN  # the real one still runs


def test_tombstones_are_pruned_after_their_ttl() -> None:
    clock = FakeClock()
    store = MemoryDelayStore(clock, tombstone_ttl=100.0)
    store.park("e1", make_entry(), 0.0)
    (item,) = store.claim(0.0, 5.0, tokens(1)).items
    store.take("e1", "t1", item.token)
    clock.now += 99.0
    store.claim(0.0, 5.0, tokens(1, 1))
    assert store.park("e1", make_entry(), 0.0) is False  # still remembered
    clock.now += 1.0
    store.claim(0.0, 5.0, tokens(1, 1))
    assert store.park("e1", make_entry(), 0.0) is True


def test_summary_counts_parked_entries_per_task() -> None:
    clock = FakeClock()
    store = MemoryDelayStore(clock)
    store.park("a", make_entry("t1"), 30.0)
    store.park("b", make_entry("t2"), 10.0)
    summary = store.summary()
    assert summary["tasks.add"].parked == 2
    assert summary["tasks.add"].next_in == 10.0


class Published:
    def __init__(self, fail: int = 0) -> None:
        self.items: list[tuple[str, str]] = []
        self.fail = fail

    def __call__(self, entry: Entry, claim: Claim) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("broker down")
        self.items.append((claim.entry_id, entry.task_id))


def test_mover_publishes_due_entries_and_sleeps_until_the_next_lead() -> None:
    clock = FakeClock()
    store = MemoryDelayStore(clock)
    published = Published()
    counter = itertools.count()
    mover = Mover(store, published, lead=1.0, lease=5.0, batch=10, poll=0.5,
                  new_token=lambda: f"k{next(counter)}")  # fmt: skip
    store.park("e1", make_entry("t1"), 0.5)
    store.park("e2", make_entry("t2"), 1.3)
    assert mover.run_once() == pytest.approx(0.3)  # e2 comes within the lead in 0.3 s
    assert published.items == [("e1", "t1")]
    clock.now += 0.3
    assert mover.run_once() == 0.5  # nothing waiting but released entries' re-checks
    assert published.items == [("e1", "t1"), ("e2", "t2")]
    assert mover.info()["released"] == 2


def test_mover_leaves_an_entry_it_could_not_publish_to_its_lease() -> None:
    clock = FakeClock()
    store = MemoryDelayStore(clock)
    published = Published(fail=1)
    mover = Mover(store, published, lead=0.0, lease=5.0, batch=10, poll=0.5)
    store.park("e1", make_entry(), 0.0)
    store.park("e2", make_entry("t2"), 0.0)
    assert mover.run_once() == 0.5  # the batch stops at the first failure
    assert published.items == [] and mover.info()["publish_errors"] == 1
    mover.run_once()
    assert published.items == []  # still leased to the failed attempt
    clock.now += 5.0
    mover.run_once()
    assert sorted(published.items) == [("e1", "t1"), ("e2", "t2")]


def test_a_batch_the_broker_did_not_confirm_is_not_released() -> None:
    """Published, then unconfirmed (the broker stopped, or refused one): none of the batch
    is released; each stays claimed and is published again when its lease ends."""
    clock = FakeClock()
    store = MemoryDelayStore(clock)
    published = Published()
    confirms: list[bool] = [False, True]

    def confirm() -> None:
        if not confirms.pop(0):
            raise ConnectionError("no confirm")

    mover = Mover(store, published, lead=0.0, lease=5.0, batch=10, poll=0.5, confirm=confirm)
    store.park("e1", make_entry(), 0.0)
    store.park("e2", make_entry("t2"), 0.0)
    assert mover.run_once() == 0.5
    assert len(published.items) == 2
    assert mover.info()["released"] == 0 and mover.info()["publish_errors"] == 1
    clock.now += 5.0
    mover.run_once()
    assert len(published.items) == 4 and mover.info()["released"] == 2
    assert confirms == []


def test_mover_drops_an_invalid_entry_and_goes_on() -> None:
    clock = FakeClock()
    store = MemoryDelayStore(clock)
    store.park("bad", make_entry(), 0.0)
    store.records["bad"].raw = "not json"
    store.park("good", make_entry("t2"), 0.0)
    published = Published()
    mover = Mover(store, published, lead=0.0)
    mover.run_once()
    assert published.items == [("good", "t2")]
    assert "bad" not in store.records and mover.info()["invalid"] == 1


def test_a_full_batch_asks_for_another_turn_at_once() -> None:
    store = MemoryDelayStore(FakeClock())
    for i in range(3):
        store.park(f"e{i}", make_entry(f"t{i}"), 0.0)
    mover = Mover(store, Published(), lead=0.0, batch=2)
    assert mover.run_once() == 0.0


def test_times_read_back_are_the_times_given_to_the_microsecond() -> None:
    clock = FakeClock()
    clock.now = 4073.4144857425995  # where (now + 30.0) - now == 30.000000000000455
    store = MemoryDelayStore(clock)
    store.park("e1", make_entry(), 0.0)
    assert store.claim(0.5, 30.0, tokens(10)).next_in == 30.0
    assert store.summary()["tasks.add"].next_in == 0.0
    assert store.take("e1", "t1", "tok0").due_in == 0.0
