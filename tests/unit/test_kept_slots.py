"""Global slots a worker keeps for its next request of a bucket (pure, fake clock in
microseconds)."""

from __future__ import annotations

from celery_extras.concurrency.kept_slots import FRESH, MIN_CAP, MOST_KEPT, ROOMY, KeptSlots
from tests.support.clock import FakeClock

US = 1e-6
B = ("t", "")
OTHER = ("t", "k")
LATER = 1_000.0  # a renewal far away


def roomy(kept: KeptSlots[str], bucket: tuple[str, str] = B, held: int = 1, cap: int = 100) -> None:
    kept.heard(bucket, held, cap)


def test_a_slot_freed_in_a_roomy_bucket_goes_to_the_next_arrival_unasked() -> None:
    clock = FakeClock(10.0)
    kept: KeptSlots[str] = KeptSlots(clock)
    assert kept.take(B) is None  # nothing kept
    roomy(kept)
    assert kept.keep(B, "h1", LATER) and kept.keep(B, "h2", LATER)
    assert len(kept) == 2
    assert kept.take(OTHER) is None  # another bucket's slots are not its
    assert kept.take(B) == "h2" and kept.take(B) == "h1" and kept.take(B) is None
    assert kept.reused == 2 and len(kept) == 0


def test_only_a_cap_a_quarter_held_or_less_and_of_min_cap_or_more_keeps_slots() -> None:
    clock = FakeClock(10.0)
    kept: KeptSlots[str] = KeptSlots(clock)
    roomy(kept, held=100 // ROOMY + 1, cap=100)
    assert not kept.keep(B, "h1", LATER)  # over a quarter held
    roomy(kept, held=100 // ROOMY, cap=100)
    assert kept.keep(B, "h1", LATER)
    roomy(kept, held=1, cap=MIN_CAP - 1)  # a small cap: the store's word is forgotten
    assert not kept.can_keep(B, LATER)
    assert kept.take(B) is None  # nor is the slot kept before given out
    assert kept.stale() == ["h1"]


def test_the_stores_word_holds_for_fresh_seconds_then_the_kept_slots_are_freed() -> None:
    clock = FakeClock(10.0)
    kept: KeptSlots[str] = KeptSlots(clock)
    roomy(kept)
    assert kept.keep(B, "h1", LATER)
    clock.now += FRESH - 1 * US
    assert kept.stale() == []
    assert kept.keep(B, "h2", LATER)
    clock.now += 1 * US  # the word is FRESH s old: no longer trusted
    assert not kept.can_keep(B, LATER)
    assert kept.take(B) is None
    assert sorted(kept.stale()) == ["h1", "h2"] and len(kept) == 0
    roomy(kept)  # the store answered again
    assert kept.keep(B, "h3", LATER) and kept.take(B) == "h3"


def test_a_slot_whose_lease_renewal_is_due_is_neither_kept_nor_given() -> None:
    clock = FakeClock(10.0)
    kept: KeptSlots[str] = KeptSlots(clock)
    roomy(kept)
    assert not kept.keep(B, "due", clock.now)  # its renewal is due now
    assert kept.keep(B, "h1", clock.now + 50 * US)
    clock.now += 50 * US
    assert kept.take(B) is None  # kept, but due for renewal: freed, not given
    assert kept.stale() == ["h1"]


def test_at_most_most_kept_slots_per_bucket() -> None:
    clock = FakeClock(10.0)
    kept: KeptSlots[str] = KeptSlots(clock)
    roomy(kept)
    roomy(kept, OTHER)
    assert all(kept.keep(B, f"h{i}", LATER) for i in range(MOST_KEPT))
    assert not kept.keep(B, "over", LATER)
    assert kept.keep(OTHER, "o1", LATER)
    assert len(kept) == MOST_KEPT + 1


def test_a_stopping_worker_frees_every_kept_slot() -> None:
    clock = FakeClock(10.0)
    kept: KeptSlots[str] = KeptSlots(clock)
    roomy(kept)
    roomy(kept, OTHER)
    assert kept.keep(B, "h1", LATER) and kept.keep(OTHER, "o1", LATER)
    assert sorted(kept.drain()) == ["h1", "o1"]
    assert len(kept) == 0 and not kept.can_keep(B, LATER)  # the word is forgotten too
