"""A key-run gate's parked waiting runs, watched until the delay store says a purge dropped
them (:mod:`celery_extras.keyed.purged`), and the stores' :meth:`purged` answer."""

from __future__ import annotations

from dataclasses import replace

from celery_extras.delay.memory_store import MemoryDelayStore
from celery_extras.delay.store import Selection
from celery_extras.keyed.purged import CHECK, ParkedRun, ParkedRuns
from tests.support.clock import FakeClock
from tests.unit.test_delay_core import make_entry


def _store(clock: FakeClock) -> MemoryDelayStore:
    """e1 taken, e2 purged, e3 parked (another task name, kept by the purge)."""
    store = MemoryDelayStore(clock)
    store.park("e1", make_entry("t1"), 0.0)
    store.park("e2", make_entry("t2"), 5.0)
    (claim,) = store.claim(1.0, 30.0, ["tok"]).items  # e1 alone is due within 1 s
    store.take("e1", "t1", claim.token)
    store.purge(Selection(tasks=frozenset({"tasks.add"})))
    store.park("e3", replace(make_entry("t3"), task="tasks.other"), 60.0)
    return store


def test_the_memory_store_says_which_entries_a_purge_dropped() -> None:
    store = _store(FakeClock())
    assert store.purged(["e1", "e2", "e3", "e9"]) == {
        "e1": None, "e2": True, "e3": False, "e9": None,
    }  # fmt: skip


def test_parked_runs_give_the_purged_ones_once_and_keep_the_parked() -> None:
    clock = FakeClock()
    store, runs = _store(clock), ParkedRuns(clock)
    for n in (1, 2, 3):
        runs.add(f"e{n}", ("task", f"k{n}"), f"w{n}", 30.0)
    assert runs.purged(store.purged) == [ParkedRun(("task", "k2"), "w2", clock.now + 30.0)]
    assert sorted(runs.runs) == ["e3"]  # e1 taken: forgotten; e3 still parked: watched
    assert runs.purged(store.purged) == []  # checked again only after CHECK seconds
    clock.now += CHECK
    assert runs.purged(store.purged) == [] and len(runs) == 1
    clock.now += 30.0  # its hold ran out: the key's next run adopts it
    assert runs.purged(store.purged) == [] and len(runs) == 0
