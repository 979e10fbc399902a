"""Merging revokes into Celery's worker state with per-entry expiry, on fake clocks."""

from __future__ import annotations

import time

from celery.utils.collections import LimitedSet

from celery_extras.sync.state import KNOWN_GRACE, WorkerRevokes


class Clocks:
    """A wall clock and a monotonic clock that move together, by hand."""

    def __init__(self) -> None:
        self.wall = 1_000_000.0
        self.mono = 50.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def make(expires: float = 100.0, maxlen: int = 1000) -> tuple[WorkerRevokes, Clocks]:
    clocks = Clocks()
    revoked = LimitedSet(maxlen=maxlen, expires=expires)
    state = WorkerRevokes(revoked, {}, expires, lambda: clocks.wall, lambda: clocks.mono)
    return state, clocks


def test_stored_ids_expire_at_their_own_expiry() -> None:
    state, clocks = make(expires=100.0)
    added = state.merge_ids({"soon": clocks.wall + 10, "late": clocks.wall + 90}, stored=True)
    assert added == 2
    assert state.merge_ids({"soon": clocks.wall + 10}, stored=True) == 0  # idempotent
    clocks.advance(11)
    state.revoked.purge(now=clocks.mono)
    assert "soon" not in state.revoked and "late" in state.revoked
    clocks.advance(80)
    state.revoked.purge(now=clocks.mono)
    assert "late" not in state.revoked


def test_neighbour_ids_get_the_local_expiry_and_are_handed_back_to_be_stored() -> None:
    state, clocks = make()
    state.merge_ids({"stored": clocks.wall + 50}, stored=True)
    state.merge_ids({"heard": None}, stored=False)
    state.revoked.add("broadcast")
    ids, stamps = state.unstored()
    assert ids == {"heard": clocks.wall + 100.0, "broadcast": clocks.wall + 100.0}
    assert stamps == {}
    assert state.unstored() == ({}, {})  # handed back once


def test_stamps_merge_into_celerys_lists_and_expire() -> None:
    state, clocks = make()
    state.revoked_stamps["mtask_id"] = "one"  # Celery also keeps single values
    added = state.merge_stamps(
        {("mtask_id", "two"): clocks.wall + 5, ("mtask_id", "one"): clocks.wall + 5}, stored=True
    )
    assert added == 1
    assert state.revoked_stamps == {"mtask_id": ["one", "two"]}
    clocks.advance(6)
    state.expire()
    assert state.revoked_stamps == {"mtask_id": ["one"]}
    state.revoked_stamps["other"] = ["z"]  # learnt from a broadcast only
    _, stamps = state.unstored()
    assert stamps == {("other", "z"): clocks.wall + 100.0}  # "one" is in the store already


def test_known_entries_are_forgotten_only_after_a_grace_period() -> None:
    state, clocks = make(expires=100.0)
    state.merge_ids({"x": clocks.wall + 10}, stored=True)
    clocks.advance(10 + KNOWN_GRACE / 2)
    state.expire()
    assert "x" in state.known_ids
    clocks.advance(KNOWN_GRACE)
    state.expire()
    assert "x" not in state.known_ids


def test_newest_ids_are_bounded() -> None:
    state, _ = make()
    state.merge_ids({f"id{i}": None for i in range(10)}, stored=False)
    assert state.newest_ids(3) == ["id7", "id8", "id9"]


def test_known_entries_and_merged_stamps_are_bounded_like_the_revoked_set() -> None:
    """Issue 17 item 4: 200,000 revokes used to leave 200,000 entries in ``known_ids``."""
    state, clocks = make(maxlen=100)
    state.merge_ids({f"s{i}": clocks.wall + 50 for i in range(250)}, stored=True)
    for i in range(250):
        state.revoked.add(f"b{i}")
    state.unstored()
    assert len(state.known_ids) == 100 and len(state.revoked) <= 100
    state.merge_stamps({("h", f"v{i}"): clocks.wall + 10 + i for i in range(250)}, stored=True)
    assert len(state.known_stamps) == 100 and len(state.stamp_expiry) == 100
    assert len(state.revoked_stamps["h"]) == 100
    assert state.revoked_stamps["h"][-1] == "v249"  # the soonest-expiring were evicted


def test_known_ids_still_in_celerys_set_outlive_those_it_evicted() -> None:
    """Celery's set evicts by time, ``known_ids`` was trimmed in insertion order: ids
    pulled from the store (stamped with their older write time) outlived, in the set,
    the known entries that said they were stored, and were written back."""
    state, clocks = make(expires=1000.0, maxlen=100)
    clocks.mono = time.monotonic()  # LimitedSet.add purges on the real monotonic clock
    # 100 ids from the store, written 500 s ago and earlier: s99 the oldest (the set
    # evicts it first), s0 the newest (inserted first, so the oldest of known_ids)
    state.merge_ids({f"s{i}": clocks.wall + 500 - i for i in range(100)}, stored=True)
    clocks.advance(1)
    for i in range(60):  # broadcasts of ids a client stored: the set evicts 60 s-ids
        state.revoked.add(f"b{i}", now=clocks.mono)
    assert state.note_stored([f"b{i}" for i in range(60)], clocks.wall + 999) == 60
    assert len(state.known_ids) == 100 and len(state.revoked) == 100
    assert state.unstored() == ({}, {})
    assert sorted(state.known_ids) == sorted([f"s{i}" for i in range(40)] +
                                             [f"b{i}" for i in range(60)])  # fmt: skip


def test_ids_a_client_marked_stored_are_not_handed_back() -> None:
    state, clocks = make(expires=100.0)
    for task_id in ("marked", "other", "bad-mark", "late-mark"):
        state.revoked.add(task_id)  # as Celery's revoke command adds them
    assert state.note_stored(["marked", "x" * 300, 7], clocks.wall + 50) == 1
    assert state.note_stored("other", str(clocks.wall + 50)) == 1  # one id, a numeric string
    assert state.note_stored(["bad-mark"], clocks.wall) == 0  # not ahead of now
    assert state.note_stored(["bad-mark"], float("nan")) == 0
    assert state.note_stored(["late-mark"], clocks.wall + 31 * 86400) == 0  # beyond MAX_WAIT
    assert state.note_stored({"marked": 1}, clocks.wall + 50) == 0  # not a list of ids
    assert state.stored()[0] == {"marked": clocks.wall + 50, "other": clocks.wall + 50}
    ids, _ = state.unstored()
    assert sorted(ids) == ["bad-mark", "late-mark"]
