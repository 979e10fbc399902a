"""The sync loop with a fake store: pushes, version comparison, pulls, outages, replies."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.utils.collections import LimitedSet

from celery_extras import install
from celery_extras.store.client import store_health
from celery_extras.sync.control import HELLO_REPLY_BYTES, within_bytes
from celery_extras.sync.digest import Pull, Version, plan_pull
from celery_extras.sync.entries import Parsed
from celery_extras.sync.revoke_store import SHARDS, Snapshot
from celery_extras.sync.state import WorkerRevokes
from celery_extras.sync.syncer import TRIM_CHURN, Syncer
from tests.support.workers import wait_for

SETTINGS = {
    "sync_interval": 1.0,
    "sync_reply_max": 3,
    "sync_hello_timeout": 0.1,
    "revoke_max": 100,
    "revoke_expires": 100.0,
}


class FakeStore:
    """Records calls; serves the version and entries of shard 0 set by the test (the other
    shards stay empty); can be 'down'."""

    def __init__(self) -> None:
        self.version = Version("e", 0)
        self.clock = 0
        self.ids: dict[str, float] = {}
        self.added: list[dict[str, float]] = []
        self.pulls: list[int] = []  # shard 0's reads: the seq read after (0: everything)
        self.page_size = 0  # shard 0's entries come this many a page (0: all in one)
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise redis.ConnectionError("store down")

    def add(self, ids: Any, stamps: Any, clock: int = 0) -> int:
        self._check()
        self.added.append(dict(ids))
        return len(ids)

    def probe(self, clock: int = 0) -> tuple[Version, int]:
        self._check()
        return Version.of_shards([self.version] + [Version("e", 0)] * (SHARDS - 1)), self.clock

    def legacy(self) -> Snapshot:
        self._check()
        return Snapshot(Version("", 0), 0, Parsed(), Parsed())

    def pages(self, shard: int, after: int = 0, clock: int = 0) -> Iterator[Snapshot]:
        self._check()
        if shard:
            yield Snapshot(Version("e", 0), self.clock, Parsed(), Parsed())
            return
        self.pulls.append(after)
        ids = list(self.ids.items())[after if self.page_size else 0 :]  # k changed at seq k + 1
        size = self.page_size or len(ids) or 1
        for start in range(0, max(len(ids), 1), size):
            page = dict(ids[start : start + size])
            upto = after + start + len(page)
            version = self.version if upto >= self.version.seq else Version("e", upto)
            yield Snapshot(version, self.clock, Parsed(page), Parsed())


def cycle(syncer: Syncer) -> None:
    """One round on the sync thread, while this thread merges what it hands over."""
    thread = threading.Thread(target=syncer.anti_entropy.cycle)
    thread.start()
    while thread.is_alive():
        syncer.drain()
        thread.join(0.01)
    syncer.drain()


def after_backoff(syncer: Syncer) -> None:
    """Wait until the store's breaker lets the sync thread ask again (one failed call closes
    the store to the whole process for ``extras_limit_store_retry``, 0.05 s here)."""
    wait_for(syncer.anti_entropy.health.up, timeout=5.0, what="the store's back-off to end")


@pytest.fixture
def syncer() -> Syncer:
    app = install(Celery("t", broker="redis://127.0.0.1:1/0", set_as_current=False),
                  limit_store_retry=0.05)  # fmt: skip
    revokes = WorkerRevokes(LimitedSet(maxlen=1000, expires=100.0), {}, 100.0)
    sync = Syncer(app, "me@host", revokes, SETTINGS)
    sync.anti_entropy.store = FakeStore()  # type: ignore[assignment]
    return sync


def store_of(syncer: Syncer) -> FakeStore:
    assert isinstance(syncer.anti_entropy.store, FakeStore)
    return syncer.anti_entropy.store


def test_cycle_pulls_only_when_the_version_moved_and_only_the_changes(syncer: Syncer) -> None:
    store = store_of(syncer)
    store.ids = {"a": time.time() + 50}
    store.version, store.clock = Version("e", 1), 500
    syncer.load()
    assert store.pulls == [0] and "a" in syncer.revokes.revoked
    assert syncer.app.clock.value == 501  # max + 1

    cycle(syncer)
    assert store.pulls == [0]  # same version: nothing read
    store.version, store.ids = Version("e", 4), {"b": time.time() + 50}
    cycle(syncer)
    assert store.pulls == [0, 1]  # only what changed after seq 1
    syncer.drain()
    assert "b" in syncer.revokes.revoked
    store.version = Version("other", 2)
    cycle(syncer)
    assert store.pulls == [0, 1, 0]  # a new epoch: everything


def test_a_pull_is_handed_over_a_page_at_a_time_and_resumed_from_its_cursor(
    syncer: Syncer,
) -> None:
    """The thread reads a page only once the consumer merged the one before: catching up
    with a big store costs the worker one page's memory; a busy consumer stops the round."""
    store = store_of(syncer)
    syncer.load()
    expiry = time.time() + 50
    store.ids = {f"id{i}": expiry for i in range(5)}
    store.version, store.page_size = Version("e", 5), 2
    syncer.anti_entropy.cycle()  # nobody merges: one page is queued, the round gives up the rest
    assert syncer.inbox.qsize() == 1 and store.pulls == [0, 0]
    syncer.drain()
    assert set(syncer.revokes.revoked) == {"id0", "id1"}
    queued: list[int] = []  # how many merges waited when the next page was queued

    class Inbox(queue.SimpleQueue[Callable[[], None]]):
        def put(self, item: Callable[[], None], block: bool = True, timeout: Any = None) -> None:
            queued.append(self.qsize())
            super().put(item)

    syncer.inbox = Inbox()
    cycle(syncer)  # on from the cursor (seq 2), a page at a time
    assert store.pulls == [0, 0, 2] and queued == [0, 0]
    assert set(syncer.revokes.revoked) == {f"id{i}" for i in range(5)}
    cursor = syncer.anti_entropy.cursor
    assert cursor is not None and cursor.shards[0] == Version("e", 5)


def test_a_burst_of_revokes_hands_freed_memory_back_once(
    syncer: Syncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[int] = []
    monkeypatch.setattr("celery_extras.sync.syncer.malloc_trim", lambda: trims.append(1) or True)
    syncer.revokes.merge_ids({f"id{i}": None for i in range(TRIM_CHURN - 1)}, stored=True)
    syncer.collect()
    assert trims == []
    syncer.revokes.note_revoked(["id0"])
    syncer.collect()
    syncer.collect()
    assert trims == [1] and syncer.info()["trims"] == 1


def test_revokes_learnt_from_a_broadcast_are_pushed_once(syncer: Syncer) -> None:
    store = store_of(syncer)
    syncer.load()
    syncer.revokes.revoked.add("heard")  # a broadcast, as the wrapped revoke command notes it
    syncer.revokes.note_revoked(["heard"])
    syncer.collect()
    cycle(syncer)
    syncer.collect()
    cycle(syncer)
    assert [list(ids) for ids in store.added] == [["heard"]]


def test_store_outage_keeps_pending_pushes_and_recovers(
    syncer: Syncer, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_of(syncer)
    store.down = True
    with caplog.at_level(logging.WARNING):
        syncer.load()
        syncer.revokes.revoked.add("heard")  # a broadcast, as the wrapped revoke command notes it
        syncer.revokes.note_revoked(["heard"])
        syncer.collect()
        cycle(syncer)
        cycle(syncer)
    failed = "celery-extras: the store failed (ConnectionError: store down); revoke store: "
    assert caplog.text.count(failed) == 1 and syncer.info()["store"] == "down"
    assert "the worker starts without the durable revokes" in caplog.text
    store.down = False
    store.ids = {"stored": time.time() + 50}
    store.version = Version("e", 1)
    after_backoff(syncer)
    cycle(syncer)
    syncer.drain()
    assert [list(ids) for ids in store.added] == [["heard"]]
    assert "stored" in syncer.revokes.revoked
    back = "celery-extras: the store answers again after"
    assert back in caplog.text and syncer.info()["store"] == "ok"


def test_a_reply_the_worker_cannot_read_is_a_store_error_not_an_outage(
    syncer: Syncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other users of the store do not back off: it answers."""
    store = store_of(syncer)
    syncer.load()

    def garbage(clock: int = 0) -> Any:
        raise ValueError("not a version")

    monkeypatch.setattr(store, "probe", garbage)
    cycle(syncer)
    info = syncer.info()
    assert info["store"] == "error" and "ValueError: not a version" in info["store_error"]
    assert store_health(syncer.app).reachable()


def test_neighbour_replies_are_validated_bounded_and_merged(
    syncer: Syncer, caplog: pytest.LogCaptureFixture
) -> None:
    syncer.hello.on_reply({"n1@host": {"clock": 900, "revoked": ["a", 7, "b", "c", "d"],
                                 "stamps": [["h", "v"], ["bad"]]}})  # fmt: skip
    syncer.hello.on_reply({"n2@host": {"clock": "not a clock", "revoked": "not a list"}})
    syncer.hello.on_reply({"n3@host": "garbage"})
    syncer.hello.on_reply(["not", "a", "dict"])
    syncer.hello.on_reply({"me@host": {"clock": 10**9}})  # our own reply is ignored
    with caplog.at_level(logging.WARNING):
        syncer.drain()
    assert syncer.app.clock.value == 901
    assert set(syncer.revokes.revoked) == {"a", "b"}  # 3 entries at most, 7 dropped
    assert syncer.revokes.revoked_stamps == {"h": ["v"]}
    assert syncer.stats["neighbours"] == ["n1@host", "n2@host"]
    assert "dropped 4 malformed revoke entries from neighbour n1@host" in caplog.text


def test_a_store_that_lost_writes_gets_them_back_from_the_worker(syncer: Syncer) -> None:
    """A failover dropped the store's last writes (its seq went back, same epoch): the
    worker pulls everything and writes again what it knew the store held."""
    store = store_of(syncer)
    store.ids = {"kept": time.time() + 50, "lost": time.time() + 60}
    store.version = Version("e", 2)
    syncer.load()
    store.ids = {"kept": store.ids["kept"]}
    store.version = Version("e", 1)
    cycle(syncer)
    syncer.drain()
    cycle(syncer)
    assert store.pulls == [0, 0]
    assert sorted(store.added[-1]) == ["kept", "lost"]
    assert store.added[-1]["lost"] == pytest.approx(time.time() + 60, abs=5)


def test_store_back_after_an_outage_is_given_what_the_worker_knew(syncer: Syncer) -> None:
    store = store_of(syncer)
    store.ids, store.version = {"a": time.time() + 50}, Version("e", 1)
    syncer.load()
    store.down = True
    cycle(syncer)
    store.down = False
    after_backoff(syncer)
    cycle(syncer)
    syncer.drain()
    cycle(syncer)
    assert [sorted(ids) for ids in store.added] == [["a"]]


def test_sharded_versions_plan_per_shard() -> None:
    def v(*seqs: int) -> Version:
        return Version.of_shards([Version("e", n) for n in seqs])

    assert plan_pull(v(1, 2), v(1, 2)) is Pull.NOTHING
    assert plan_pull(v(1, 2), v(1, 3)) is Pull.CHANGES
    # one shard lost a write, another gained two: the sum grew, but that shard went back
    assert plan_pull(v(5, 2), v(4, 4)) is Pull.EVERYTHING
    assert plan_pull(v(1, 2), Version.of_shards([Version("e", 1), Version("f", 2)])) is (
        Pull.EVERYTHING
    )
    assert plan_pull(v(1, 2), v(1, 2, 0)) is Pull.EVERYTHING  # another shard count


def test_hello_reply_keeps_the_newest_ids_within_its_byte_budget() -> None:

    ids = [f"{i:036d}" for i in range(10_000)]  # as long as Celery's UUIDs
    kept, left = within_bytes(ids, HELLO_REPLY_BYTES)
    assert kept == ids[-len(kept) :] and 1500 < len(kept) < 1700
    assert len(json.dumps(kept)) <= HELLO_REPLY_BYTES and 0 <= left < 40
