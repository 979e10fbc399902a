"""The debounce rules (:mod:`celery_extras.debounce.table`) on a fake clock.

Each scenario takes a :class:`Harness`, so ``tests/integration/test_debounce_holds.py``
runs the same ones on the Lua form (:class:`~celery_extras.debounce.redis_holds.RedisDebounce`)
against a real Redis: the two must agree. Times are short (a few tenths of a second) since
the Redis form lets them pass for real.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import pytest

from celery_extras.debounce.table import (
    REMEMBER,
    DebounceKey,
    DebounceTable,
    DebounceVerdict,
    due_of,
)

KEY = ("tests.debounce.save", "account-1")
OTHER = ("tests.debounce.save", "account-2")
WAIT = 0.2
LEASE = 30.0


@dataclass
class Harness:
    """Holds under test, their clock (:meth:`now`, seconds) and a way to let time pass."""

    holds: Any
    now: Callable[[], float]
    advance: Callable[[float], None]
    #: each message's send time: when it was first asked for, unless told
    sent: dict[str, float] = field(default_factory=dict)

    def ask(self, mid: str, holder: str, *, key: Hashable = KEY, wait: float = WAIT,
            max_wait: float | None = None, lease: float = LEASE, retries: int = 0,
            context: str = "", sent: float | None = None) -> DebounceVerdict:  # fmt: skip
        when = self.sent.setdefault(mid, self.now() if sent is None else sent)
        verdict: DebounceVerdict = self.holds.ask(key, mid, when, holder, wait, max_wait, lease,
                                          retries, context)  # fmt: skip
        return verdict

    def endings(self, mid: str, holder: str, key: Hashable = KEY) -> dict[str, str] | None:
        """The ids run *mid* covered, each with its stored context (``""`` for none)."""
        finished = self.holds.finish(key, mid, holder)
        if finished is None:
            return None
        return {one: finished.contexts.get(one, "") for one in finished.covered}

    def finish(self, mid: str, holder: str, key: Hashable = KEY) -> list[str] | None:
        """The ids run *mid* covered (sorted), or ``None`` when it was no longer the run."""
        finished = self.holds.finish(key, mid, holder)
        return None if finished is None else sorted(finished.covered)


RUN, WAITS = DebounceVerdict("run"), DebounceVerdict("wait")


def covered(by: str) -> DebounceVerdict:
    return DebounceVerdict("covered", by)


def ten_messages_run_once_with_the_last(h: Harness) -> None:
    """A burst of ten: each replaces the one before; the last runs once the key is quiet
    for ``wait``, and covers the nine others (told when they ask again)."""
    for i in range(10):
        verdict = h.ask(f"m{i}", "AB"[i % 2], context=f"{{m{i}}}")
        assert verdict == WAITS and 0.19 <= verdict.due <= WAIT + 1e-6
        if i:
            assert h.ask(f"m{i - 1}", "AB"[(i - 1) % 2], context=f"{{m{i - 1}}}") == covered(
                f"m{i}"
            )
        h.advance(0.01)
    assert h.ask("m9", "B") == WAITS  # not quiet long enough yet
    h.advance(WAIT)
    assert h.ask("m9", "B") == RUN
    assert h.endings("m9", "B") == {f"m{i}": f"{{m{i}}}" for i in range(9)}


def each_message_starts_the_quiet_period_again(h: Harness) -> None:
    assert h.ask("m0", "A") == WAITS
    h.advance(0.15)
    assert h.ask("m1", "B") == WAITS
    h.advance(0.1)
    assert h.ask("m0", "A") == covered("m1")  # its own wait ended: replaced
    verdict = h.ask("m1", "B")
    assert verdict == WAITS and 0.05 < verdict.due < 0.15  # quiet for 0.1 s of 0.2
    h.advance(verdict.due + 0.01)
    assert h.ask("m1", "B") == RUN
    assert h.finish("m1", "B") == ["m0"]


def max_wait_bounds_a_steady_stream(h: Harness) -> None:
    """A message every 0.125 s, ``wait`` 0.2 s, ``max_wait`` 0.5 s: the burst runs 0.5 s
    after its first message, with the last message before then; the next one starts the
    next burst."""
    for i in range(4):
        verdict = h.ask(f"s{i}", "A", max_wait=0.5)
        assert verdict == WAITS
        h.advance(0.125)
    assert h.ask("s3", "A", max_wait=0.5) == RUN  # 0.5 s after s0, though s3 came 0.125 s ago
    assert h.ask("s4", "B", max_wait=0.5) == WAITS  # the next burst
    for i in range(3):
        assert h.ask(f"s{i}", "A", max_wait=0.5) == covered("s3")
    assert h.finish("s3", "A") == ["s0", "s1", "s2"]
    h.advance(WAIT)
    assert h.ask("s4", "B", max_wait=0.5) == RUN
    assert h.finish("s4", "B") == []


def a_message_past_max_wait_runs_at_once(h: Harness) -> None:
    """The next message did not ask at its due time; a message after ``max_wait`` runs
    itself, at once, and covers the burst."""
    assert h.ask("a", "A", max_wait=0.25) == WAITS
    h.advance(0.3)
    assert h.ask("b", "B", max_wait=0.25) == RUN
    assert h.ask("a", "A", max_wait=0.25) == covered("b")
    assert h.finish("b", "B") == ["a"]


def a_message_during_a_run_starts_the_next_burst(h: Harness) -> None:
    """At most one run of a key at a time: the next burst waits for the run's end."""
    assert h.ask("r", "A", wait=0.05) == WAITS
    h.advance(0.06)
    assert h.ask("r", "A", wait=0.05) == RUN
    assert h.ask("n", "B") == WAITS
    h.advance(WAIT + 0.01)
    verdict = h.ask("n", "B")
    assert verdict == WAITS and verdict.due > 20.0  # until the run's lease ends, at most
    assert h.finish("r", "A") == []  # n is not r's: it came while r ran
    assert h.ask("n", "B") == RUN
    assert h.finish("n", "B") == []


def two_keys_are_independent(h: Harness) -> None:
    assert h.ask("a0", "A") == WAITS
    assert h.ask("b0", "B", key=OTHER) == WAITS
    assert h.ask("a1", "A") == WAITS
    h.advance(WAIT + 0.01)
    assert h.ask("b0", "B", key=OTHER) == RUN
    assert h.ask("a1", "A") == RUN  # another key's run does not hold it
    assert h.ask("a0", "A") == covered("a1")
    assert h.finish("b0", "B", key=OTHER) == []
    assert h.finish("a1", "A") == ["a0"]


def a_dead_runs_key_frees_after_its_lease_and_its_callers_pass_on(h: Harness) -> None:
    assert h.ask("c", "A") == WAITS
    assert h.ask("r", "A") == WAITS
    assert h.ask("c", "A", context="{c}") == covered("r")
    h.advance(WAIT + 0.01)
    assert h.ask("r", "A", lease=0.2) == RUN
    h.advance(0.25)  # A died: the run's lease ran out
    assert h.ask("n", "B") == WAITS
    h.advance(WAIT + 0.01)
    assert h.ask("n", "B") == RUN
    assert h.endings("n", "B") == {"r": "", "c": "{c}"}  # r's own message had no holder
    assert h.finish("r", "A") is None  # A comes back: it ends nothing
    verdict = h.ask("r", "B")  # r delivered again (acks_late): it ends, with n's outcome
    assert verdict == covered("n") and verdict.ended


def an_unconfirmed_message_ends_where_it_is_delivered_again(h: Harness) -> None:
    """m0 was replaced, but its holder never asked again (it died): the run gives it its
    result only, and when the broker delivers it again it ends there (never runs again)."""
    assert h.ask("m0", "A") == WAITS
    assert h.ask("m1", "B") == WAITS
    h.advance(WAIT + 0.01)
    assert h.ask("m1", "B") == RUN
    assert h.endings("m1", "B") == {"m0": ""}
    verdict = h.ask("m0", "C", context="{m0}")
    assert verdict == covered("m1") and verdict.ended
    verdict = h.ask("m0", "C")  # once more: sent before m1, it is still m1's burst
    assert verdict == covered("m1") and verdict.ended


def a_second_delivery_of_a_live_run_is_covered_but_a_retry_goes_on(h: Harness) -> None:
    assert h.ask("r", "A", wait=0.05) == WAITS
    h.advance(0.06)
    assert h.ask("r", "A") == RUN
    assert h.ask("r", "B") == covered("r")  # the same message delivered twice
    assert h.ask("r", "B", retries=1) == RUN  # its retry (the retries header grew)
    assert h.finish("r", "A") is None
    assert h.finish("r", "B") == []


def a_run_that_steps_aside_goes_on_where_it_is_received(h: Harness) -> None:
    assert h.ask("r", "A", wait=0.05) == WAITS
    h.advance(0.06)
    assert h.ask("r", "A") == RUN
    assert h.holds.step_aside(KEY, "r", "A", 1.0, LEASE)
    assert not h.holds.step_aside(KEY, "r", "A", 1.0, LEASE)
    assert h.ask("r", "B") == RUN
    assert h.finish("r", "B") == []


def a_parked_next_message_is_hurried_when_the_run_ends(h: Harness) -> None:
    assert h.ask("r", "A", wait=0.05) == WAITS
    h.advance(0.06)
    assert h.ask("r", "A") == RUN
    assert h.ask("n", "B") == WAITS
    assert h.holds.park_next(KEY, "n", "B", "entry-1", 5.0, LEASE)
    assert h.holds.finish(KEY, "r", "A").parked == ""  # n is not due yet: no hurry
    assert h.ask("r2", "A", wait=0.05) == WAITS  # replaces n (n is covered by r2)
    h.advance(0.06)
    assert h.ask("r2", "A", wait=0.05) == RUN
    assert h.ask("n3", "B", wait=0.05) == WAITS
    h.advance(0.06)
    assert h.ask("n3", "B", wait=0.05) == WAITS  # due; r2 runs
    assert h.holds.park_next(KEY, "n3", "B", "entry-3", 1.0, LEASE)
    assert not h.holds.park_next(KEY, "n3", "B", "entry-3", 1.0, LEASE)  # not B's any more
    assert h.holds.finish(KEY, "r2", "A").parked == "entry-3"
    assert h.ask("n", "C") == covered("r2") and h.ask("n3", "C", wait=0.05) == RUN
    assert h.finish("n3", "C") == []


def a_dropped_next_message_takes_its_confirmed_callers_along(h: Harness) -> None:
    assert h.ask("n0", "A") == WAITS
    assert h.ask("n1", "B") == WAITS
    assert h.ask("u", "A") == WAITS  # replaces n1: n0, n1 covered by u
    assert h.ask("n0", "A", context="{n0}") == covered("u")  # confirmed; n1 is not
    dropped = h.holds.drop(KEY, "u")
    assert (dropped.covered, dropped.contexts) == (["n0"], {"n0": "{n0}"})
    assert h.ask("n1", "B") == WAITS  # not covered any more: a message of its own
    assert h.holds.drop(KEY, "n1") is not None
    assert h.holds.drop(KEY, "nothing") is None


def a_forgotten_next_message_waits_for_its_delivery(h: Harness) -> None:
    assert h.ask("c", "A") == WAITS
    assert h.ask("n", "A") == WAITS
    assert h.ask("c", "A", context="{c}") == covered("n")
    h.holds.forget(KEY, "n", "A")  # A's connection was lost: the broker delivers n again
    h.advance(WAIT + 0.01)
    assert h.ask("n", "B") == RUN  # the burst waited for it
    assert h.endings("n", "B") == {"c": "{c}"}


def an_orphan_delivered_again_is_covered_by_the_burst_waiting(h: Harness) -> None:
    assert h.ask("o", "A", lease=0.2) == WAITS
    h.advance(0.25)  # A died holding o: its lease ran out
    assert h.ask("n", "B") == WAITS
    assert h.ask("o", "C") == covered("n")  # the broker delivers o again
    h.advance(WAIT + 0.01)
    assert h.ask("n", "B") == RUN
    assert h.finish("n", "B") == ["o"]


def renewal_reports_holds_that_ran_out(h: Harness) -> None:
    assert h.ask("r", "A", wait=0.05) == WAITS
    h.advance(0.06)
    assert h.ask("r", "A", lease=0.2) == RUN
    assert h.holds.renew(KEY, ["r"], "A", 0.2) == []
    h.advance(0.25)
    assert h.holds.renew(KEY, ["r"], "A", 0.2) == ["r"]
    assert h.ask("n", "B", wait=0.05) == WAITS
    h.advance(0.06)
    assert h.ask("n", "B", wait=0.05) == RUN
    assert h.finish("n", "B") == ["r"]
    assert h.ask("r", "B").ended  # remembered until delivered again


def the_last_message_is_the_last_sent_not_the_last_to_arrive(h: Harness) -> None:
    """Two workers took a burst's messages out of order: the older one is covered by the
    newer, which runs, with its arguments."""
    t = h.now()
    assert h.ask("m1", "B", sent=t) == WAITS
    assert h.ask("m0", "A", sent=t - 0.05, context="{m0}") == covered("m1")
    h.advance(WAIT + 0.01)
    assert h.ask("m1", "B") == RUN
    assert h.endings("m1", "B") == {"m0": "{m0}"}


def the_last_sent_wins_by_a_fraction_of_a_millisecond(h: Harness) -> None:
    """Messages sent 0.3 ms apart (a chord's header, one producer) are ordered by their
    stamps, not by the millisecond they share; so is one sent just after a run's message."""
    t = math.floor(h.now() * 1000) / 1000 + 0.0004  # three stamps in one millisecond
    assert h.ask("m1", "B", sent=t) == WAITS
    assert h.ask("m0", "A", sent=t - 0.0003, context="{m0}") == covered("m1")
    h.advance(WAIT + 0.01)
    assert h.ask("m1", "B") == RUN
    assert h.ask("m2", "A", sent=t + 0.0003) == WAITS  # after m1: the next burst
    assert h.finish("m1", "B") == ["m0"]
    h.advance(WAIT + 0.01)
    assert h.ask("m2", "A") == RUN
    assert h.finish("m2", "A") == []


def a_message_of_a_burst_delivered_during_or_after_its_run_is_covered_by_it(h: Harness) -> None:
    t = h.now()
    assert h.ask("r", "A", wait=0.05, sent=t) == WAITS
    h.advance(0.06)
    assert h.ask("r", "A") == RUN
    assert h.ask("late", "B", sent=t - 0.01, context="{late}") == covered("r")  # r's burst
    assert h.endings("r", "A") == {"late": "{late}"}
    verdict = h.ask("later", "B", sent=t - 0.02)  # after r ended: it ends where it arrives
    assert verdict == covered("r") and verdict.ended
    assert h.ask("new", "B", wait=0.05) == WAITS  # sent after r's message: a burst of its own
    h.advance(0.06)
    assert h.ask("new", "B") == RUN
    assert h.finish("new", "B") == []


SCENARIOS = [
    ten_messages_run_once_with_the_last,
    each_message_starts_the_quiet_period_again,
    max_wait_bounds_a_steady_stream,
    a_message_past_max_wait_runs_at_once,
    a_message_during_a_run_starts_the_next_burst,
    two_keys_are_independent,
    a_dead_runs_key_frees_after_its_lease_and_its_callers_pass_on,
    an_unconfirmed_message_ends_where_it_is_delivered_again,
    a_second_delivery_of_a_live_run_is_covered_but_a_retry_goes_on,
    a_run_that_steps_aside_goes_on_where_it_is_received,
    a_parked_next_message_is_hurried_when_the_run_ends,
    a_dropped_next_message_takes_its_confirmed_callers_along,
    a_forgotten_next_message_waits_for_its_delivery,
    an_orphan_delivered_again_is_covered_by_the_burst_waiting,
    renewal_reports_holds_that_ran_out,
    the_last_message_is_the_last_sent_not_the_last_to_arrive,
    the_last_sent_wins_by_a_fraction_of_a_millisecond,
    a_message_of_a_burst_delivered_during_or_after_its_run_is_covered_by_it,
]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def idle(state: DebounceKey) -> bool:
    """Nothing held, covered or waiting to be delivered again: at most the last run."""
    return state.empty() and not state.contexts


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_the_table_keeps_the_rules(scenario: Callable[[Harness], None]) -> None:
    clock = FakeClock()
    table = DebounceTable(clock)
    scenario(Harness(table, clock, clock.advance))
    assert all(idle(state) for state in table.keys.values())
    clock.advance(REMEMBER)
    for key in list(table.keys):
        assert table.finish(key, "nothing", "A") is None  # a day later: the key is forgotten
    assert table.keys == {}


def test_due_of_is_wait_after_the_last_message_and_max_wait_after_the_first() -> None:
    assert due_of(10.0, 4.0, 0.5, None) == 10.5
    assert due_of(10.0, 4.0, 0.5, 6.2) == 10.2
    assert due_of(10.0, 9.0, 0.5, 6.0) == 10.5


@pytest.mark.parametrize("seed", range(40))
def test_random_streams_keep_every_promise(seed: int) -> None:
    """Messages of one key arrive at random times on two workers that ask again exactly
    when told (runs last a random while): at most one run at a time; each run is its burst's
    last message, starts ``wait`` after it arrived (or ``max_wait`` after the burst's first)
    and never earlier; every message is run or covered by a run, exactly once."""
    rng = random.Random(seed)
    clock = FakeClock()
    table = DebounceTable(clock)
    wait, max_wait = 0.5, rng.choice([None, 1.0, 2.0])
    start = clock()
    arrivals = sorted(start + rng.uniform(0, 8) for _ in range(rng.randrange(1, 40)))
    asks: list[tuple[float, str]] = [(t, f"m{i}") for i, t in enumerate(arrivals)]
    arrived: dict[str, float] = {}
    running: tuple[str, float] | None = None  # the run, and when it ends
    runs: list[tuple[str, float, list[str]]] = []  # (id, start, covered)
    done: set[str] = set()
    while asks or running is not None:
        ends = running[1] if running is not None else float("inf")
        if asks and asks[0][0] <= ends:
            when, mid = asks.pop(0)
            clock.t = when
            arrived.setdefault(mid, when)
            holder = "AB"[int(mid[1:]) % 2]
            verdict = table.ask(KEY, mid, arrived[mid], holder, wait, max_wait, 30.0)
            if verdict.kind == "run":
                assert running is None, "two runs at once"
                running = (mid, when + rng.uniform(0.0, 1.5))
                runs.append((mid, when, []))
            elif verdict.kind == "wait":
                asks.append((when + verdict.due + 1e-6, mid))
                asks.sort()
            else:
                assert mid not in done
                done.add(mid)
            continue
        assert running is not None
        clock.t = running[1]
        finished = table.finish(KEY, running[0], "AB"[int(running[0][1:]) % 2])
        assert finished is not None
        runs[-1][2].extend(finished.covered)
        running = None
        # the release notice: the messages waiting ask again now (not those yet to arrive)
        asks = sorted((min(t, clock.t) if mid in arrived else t, mid) for t, mid in asks)
    assert all(idle(state) for state in table.keys.values())
    covered_ids = [one for _, _, ids in runs for one in ids]
    assert sorted(covered_ids + [r for r, _, _ in runs]) == sorted(arrived)  # exactly once
    previous_start = -1.0
    for run_id, began, ids in runs:
        burst = [*ids, run_id]
        assert all(arrived[one] > previous_start for one in burst)  # none from a run before
        assert arrived[run_id] == max(arrived[one] for one in burst)  # the last message
        first = min(arrived[one] for one in burst)
        due = due_of(arrived[run_id], first, wait, max_wait)
        assert began >= due - 1e-9  # never early
        previous_start = began
