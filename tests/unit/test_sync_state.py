"""Merging revokes into Celery's worker state with per-entry expiry, on fake clocks."""

from __future__ import annotations

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
