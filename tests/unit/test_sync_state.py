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
    state.revoked.add("broadcast")  # as Celery's revoke command adds it, then tells us
    assert state.note_revoked(["broadcast"]) == 1
    state.revoked.add("expired-request")  # Celery's own addition: not a revoke to share
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


def test_held_ids_keep_the_stores_expiry_read_back_from_celerys_set() -> None:
    state, clocks = make(expires=100.0)
    state.merge_ids({"stored": clocks.wall + 40}, stored=True)
    state.revoked.add("broadcast", now=clocks.mono)
    clocks.advance(10)
    ids, _ = state.held()
    assert ids == {"stored": clocks.wall + 30, "broadcast": clocks.wall + 90}
    clocks.advance(31)
    state.revoked.purge(now=clocks.mono)
    assert state.held()[0] == {"broadcast": clocks.wall + 59}


def test_known_stamps_are_forgotten_only_after_a_grace_period() -> None:
    state, clocks = make(expires=100.0)
    state.merge_stamps({("h", "x"): clocks.wall + 10}, stored=True)
    clocks.advance(10 + KNOWN_GRACE / 2)
    state.expire()
    assert ("h", "x") in state.known_stamps
    clocks.advance(KNOWN_GRACE)
    state.expire()
    assert ("h", "x") not in state.known_stamps


def test_newest_ids_are_bounded() -> None:
    state, _ = make()
    state.merge_ids({f"id{i}": None for i in range(10)}, stored=False)
    assert state.newest_ids(3) == ["id7", "id8", "id9"]


def test_unstored_ids_and_merged_stamps_are_bounded_like_the_revoked_set() -> None:
    """Issue 17 item 4: 200,000 revokes used to leave 200,000 entries beside Celery's set."""
    state, clocks = make(maxlen=100)
    state.merge_ids({f"s{i}": clocks.wall + 50 for i in range(250)}, stored=True)
    assert state.unstored_ids == {}  # nothing is kept per stored id
    for i in range(250):
        state.revoked.add(f"b{i}")
        state.note_revoked(f"b{i}")
    assert len(state.unstored_ids) == 100 and len(state.revoked) <= 100
    ids, _ = state.unstored()
    assert sorted(ids) == sorted(f"b{i}" for i in range(150, 250))
    state.merge_stamps({("h", f"v{i}"): clocks.wall + 10 + i for i in range(250)}, stored=True)
    assert len(state.known_stamps) == 100 and len(state.stamp_expiry) == 100
    assert len(state.revoked_stamps["h"]) == 100
    assert state.revoked_stamps["h"][-1] == "v249"  # the soonest-expiring were evicted


def test_an_id_pulled_from_the_store_is_not_handed_back() -> None:
    """A broadcast that the next pull overtakes: the store has the id, no write back."""
    state, clocks = make()
    state.revoked.add("x")
    state.note_revoked(["x"])
    state.merge_ids({"x": clocks.wall + 50}, stored=True)
    assert state.unstored() == ({}, {})


def test_ids_a_client_marked_stored_are_not_handed_back() -> None:
    state, clocks = make(expires=100.0)
    for task_id in ("marked", "other", "bad-mark", "nan-mark", "late-mark", "unmarked"):
        state.revoked.add(task_id)  # as Celery's revoke command adds them
    assert state.note_revoked(["marked", "x" * 300, 7], clocks.wall + 50) == 0
    assert state.note_revoked("other", str(clocks.wall + 50)) == 0  # a numeric string
    assert state.note_revoked(["bad-mark"], clocks.wall) == 1  # not ahead of now
    assert state.note_revoked(["nan-mark"], float("nan")) == 1
    assert state.note_revoked(["late-mark"], clocks.wall + 31 * 86400) == 1  # beyond MAX_WAIT
    assert state.note_revoked(["unmarked", "x" * 300, 7, "not-in-the-set"]) == 1
    assert state.note_revoked({"marked": 1}) == 0  # not a list of ids
    ids, _ = state.unstored()
    assert sorted(ids) == ["bad-mark", "late-mark", "nan-mark", "unmarked"]


def test_ids_celery_loaded_itself_are_adopted_to_be_stored_but_for_those_the_store_has() -> None:
    state, clocks = make(expires=100.0)
    state.revoked.add("from-statedb", now=clocks.mono - 30)  # as Celery loads --statedb
    state.revoked.add("also-in-store", now=clocks.mono)
    assert state.adopt_held() == 2
    state.merge_ids({"also-in-store": clocks.wall + 80}, stored=True)
    assert state.unstored()[0] == {"from-statedb": clocks.wall + 70}
