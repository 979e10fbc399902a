"""Validation of revoke entries from the store and from neighbours, and the pull plan."""

from __future__ import annotations

import math

from celery_extras.sync.digest import Pull, Version, plan_pull
from celery_extras.sync.entries import (
    MAX_ID_LENGTH,
    parse_expiring,
    parse_ids,
    parse_stamp_member,
    parse_stamps,
    stamp_member,
    valid_clock,
)


def test_expiring_ids_keep_valid_unexpired_entries_and_count_the_rest() -> None:
    parsed = parse_expiring(
        [
            ("a", "110.5"),
            ("b", 120),
            ("expired", 99.0),
            ("", 200),
            ("x" * (MAX_ID_LENGTH + 1), 200),
            (7, 200),
            ("nan", math.nan),
            ("word", "soon"),
            ("bool", True),
        ],
        now=100.0,
    )
    assert parsed.kept == {"a": 110.5, "b": 120.0}
    assert parsed.dropped == 6
    assert len(parsed.examples) == 3


def test_stamps_round_trip_through_their_store_member() -> None:
    member = stamp_member("mtask_id", "abc")
    assert member == '["mtask_id","abc"]'
    assert parse_stamp_member(member) == ("mtask_id", "abc")
    assert parse_stamp_member(stamp_member("n", 3)) == ("n", 3)
    for bad in ("not json", '["only-one"]', '[1, "x"]', '["h", {"a": 1}]', '["h", null]', 5):
        assert parse_stamp_member(bad) is None
    parsed = parse_expiring([(("h", "v"), 200), (("h", ["list"]), 200)], 100.0, stamps=True)
    assert parsed.kept == {("h", "v"): 200.0}
    assert parsed.dropped == 1


def test_neighbour_ids_are_bounded_and_validated() -> None:
    parsed = parse_ids(["a", "b", 3, "c", "d"], limit=4)
    assert list(parsed.kept) == ["a", "b", "c"]
    assert parsed.dropped == 2  # the int, and "d" beyond the bound
    assert parse_ids({"not": "a list"}, 10).dropped == 1
    assert parse_ids(None, 10).dropped == 0


def test_neighbour_stamps_accept_both_shapes() -> None:
    assert list(parse_stamps([["h", "v"], ["h", 2], ["bad"]], 10).kept) == [("h", "v"), ("h", 2)]
    parsed = parse_stamps({"h": ["v1", "v2"], "g": "w", "bad": {"x": 1}}, 10)
    assert list(parsed.kept) == [("h", "v1"), ("h", "v2"), ("g", "w")]
    assert parsed.dropped == 1
    assert parse_stamps([["h", str(i)] for i in range(5)], 2).dropped == 3


def test_clock_values() -> None:
    assert valid_clock(0) and valid_clock(10**12)
    assert not valid_clock(-1) and not valid_clock(True) and not valid_clock(1.5)
    assert not valid_clock("3")


def test_plan_pull_from_cursor_and_store_version() -> None:
    store = Version("e1", 10)
    assert plan_pull(None, store) is Pull.EVERYTHING
    assert plan_pull(Version("e0", 10), store) is Pull.EVERYTHING  # store emptied, new epoch
    assert plan_pull(Version("e1", 12), store) is Pull.EVERYTHING  # store lost changes
    assert plan_pull(Version("e1", 4), store) is Pull.CHANGES
    assert plan_pull(Version("e1", 10), store) is Pull.NOTHING
