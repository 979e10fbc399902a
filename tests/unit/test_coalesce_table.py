"""The coalescing rules (:mod:`celery_extras.coalesce.table`) on a fake clock.

Each scenario takes a :class:`Harness`, so ``tests/integration/test_coalesce_holds.py``
runs the same ones on the Lua form (:class:`~celery_extras.coalesce.redis_holds.RedisHolds`)
against a real Redis: the two must agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from celery_extras.coalesce.table import REMEMBER, CoalesceTable, CoalesceVerdict

KEY = ("tasks.reindex", "account-1")
LEASE = 30.0
#: A lease that runs out within a scenario: long enough that the calls made before it
#: should run out take less, on a real store on a loaded machine too.
SHORT_LEASE = 1.0
PAST_SHORT_LEASE = 1.5


@dataclass
class Harness:
    """Holds under test, their clock (:meth:`now`, seconds) and a way to let time pass."""

    holds: Any
    now: Callable[[], float]
    advance: Callable[[float], None]

    def ask(
        self, mid: str, holder: str, *, sent: float | None = None, lease: float = LEASE,
        keep: str = "first", retries: int = 0, context: str = "",
    ) -> CoalesceVerdict:  # fmt: skip
        when = self.now() - 1.0 if sent is None else sent
        verdict: CoalesceVerdict = self.holds.ask(
            KEY, mid, when, holder, lease, keep, retries, context
        )
        return verdict

    def endings(self, mid: str, holder: str) -> dict[str, str] | None:
        """The ids run *mid* covered, each with its stored context (``""`` for none)."""
        finished = self.holds.finish(KEY, mid, holder)
        if finished is None:
            return None
        return {one: finished.contexts.get(one, "") for one in finished.covered}

    def finish(self, mid: str, holder: str) -> list[str] | None:
        """The ids run *mid* covered (sorted), or ``None`` when it was no longer the run."""
        finished = self.holds.finish(KEY, mid, holder)
        return None if finished is None else sorted(finished.covered)

    def later(self) -> float:
        """A send time after every run started so far."""
        self.advance(0.01)
        return self.now()


RUN, WAIT = CoalesceVerdict("run"), CoalesceVerdict("wait")


def covered(by: str) -> CoalesceVerdict:
    return CoalesceVerdict("covered", by)


def queued_before_any_run_runs_once(h: Harness) -> None:
    """20 messages sent before any worker ran the key: one run covers the 19 others."""
    sent = h.now() - 5.0
    assert h.ask("m0", "A", sent=sent) == RUN
    for i in range(1, 20):
        assert h.ask(f"m{i}", "AB"[i % 2], sent=sent) == covered("m0")
    assert h.finish("m0", "A") == sorted(f"m{i}" for i in range(1, 20))


def sent_before_a_run_started_and_delivered_after_it_ended_is_covered(h: Harness) -> None:
    """A backlog: m1 was sent before m0's run started, but reaches a worker after it ended:
    m0's run did its work. A message sent after the run started runs again."""
    sent = h.now() - 5.0
    assert h.ask("m0", "A", sent=sent) == RUN
    assert h.finish("m0", "A") == []
    verdict = h.ask("m1", "B", sent=sent)
    assert verdict == covered("m0") and verdict.ended
    assert h.ask("m2", "B", sent=h.later()) == RUN
    assert h.finish("m2", "B") == []


def sent_in_the_millisecond_a_run_started_but_after_it_is_not_covered(h: Harness) -> None:
    """The store keeps milliseconds: a message sent 0.4 ms after its key's run started, in
    the same millisecond, is not covered by it (the run may have read what it changed),
    once it has ended nor while it runs."""
    assert h.ask("r", "A") == RUN
    sent = h.now() + 0.0004  # the clock is read after r started
    assert h.finish("r", "A") == []
    assert h.ask("m", "B", sent=sent) == RUN
    assert h.ask("w", "A", sent=h.now() + 0.0004) == WAIT
    assert h.finish("m", "B") == []
    assert h.ask("w", "A") == RUN
    assert h.finish("w", "A") == []


def sent_during_a_run_gives_exactly_one_more(h: Harness) -> None:
    """10 messages sent while the key runs: the first waits, the other 9 are covered by
    it; it starts only when the run ends, and covers them then."""
    assert h.ask("r", "A") == RUN
    assert h.ask("w", "B", sent=h.later()) == WAIT
    for i in range(9):
        assert h.ask(f"c{i}", "AB"[i % 2], sent=h.later()) == covered("w")
    assert h.ask("w", "B") == WAIT  # asked again while the run goes on: still waiting
    assert LEASE - 2.0 < h.ask("w", "B").due <= LEASE  # when the run's lease ends
    assert h.finish("r", "A") == []
    sent = h.now()
    assert h.ask("w", "B") == RUN
    assert h.ask("late", "A", sent=sent) == covered("w")  # sent before w started
    assert h.finish("w", "B") == sorted([*(f"c{i}" for i in range(9)), "late"])
    assert h.ask("next", "A", sent=h.later()) == RUN  # nothing runs: the next one runs


def keep_last_makes_the_newest_message_the_waiting_run(h: Harness) -> None:
    assert h.ask("r", "A") == RUN
    assert h.ask("w1", "B", sent=h.later(), keep="last") == WAIT
    assert h.ask("w2", "A", sent=h.later(), keep="last") == WAIT  # replaces w1
    assert h.ask("w1", "B", keep="last") == covered("w2")  # w1 learns it is covered
    assert h.ask("w3", "B", sent=h.later(), keep="last") == WAIT  # replaces w2
    assert h.ask("w2", "A", keep="last") == covered("w3")
    assert h.finish("r", "A") == []
    assert h.ask("w3", "B", keep="last") == RUN
    assert h.finish("w3", "B") == ["w1", "w2"]


def a_dead_runs_key_frees_after_its_lease_and_its_callers_pass_on(h: Harness) -> None:
    """The worker running the key dies (no renewal): once its lease ran out, the waiting
    run starts and covers what the dead run covered, and the dead run's own id."""
    assert h.ask("r", "A", lease=SHORT_LEASE) == RUN
    assert h.ask("c", "A", sent=h.now() - 2.0) == covered("r")
    assert h.ask("w", "B", sent=h.later(), lease=SHORT_LEASE) == WAIT
    assert h.holds.renew(KEY, ["w"], "B", 5.0) == []  # B lives on, A does not
    h.advance(PAST_SHORT_LEASE)
    assert h.ask("w", "B") == RUN
    assert h.finish("r", "A") is None  # A comes back too late: not the run
    assert h.finish("w", "B") == ["c", "r"]


def a_second_delivery_of_a_live_run_is_covered_but_a_retry_goes_on(h: Harness) -> None:
    assert h.ask("r", "A") == RUN
    assert h.ask("r", "B") == covered("r")  # the broker delivered it again: A runs it
    assert h.ask("r", "A") == RUN  # A asking again keeps it
    assert h.holds.step_aside(KEY, "r", "A", 60.0, LEASE)  # A's run raised Retry
    assert h.ask("w", "A", sent=h.later()) == WAIT  # sent meanwhile: waits for the chain
    assert h.ask("r", "B", retries=1) == RUN  # the retry, on B, is the same run
    assert h.finish("r", "A") is None  # A no longer holds it
    assert h.finish("r", "B") == []
    assert h.ask("w", "A") == RUN


def a_retry_is_recognised_by_its_retries_header_without_stepping_aside(h: Harness) -> None:
    """The retry's message can reach another worker before the first hears its end."""
    assert h.ask("r", "A") == RUN
    assert h.ask("r", "B", retries=1) == RUN
    assert h.ask("r", "C", retries=1) == covered("r")  # a second delivery of the retry
    assert h.finish("r", "A") is None


def a_forgotten_waiting_run_passes_its_callers_on(h: Harness) -> None:
    """A worker that lost its connection drops its waiting run: the broker delivers it
    again; meanwhile the next message waits in its place and covers its callers."""
    assert h.ask("r", "A") == RUN
    assert h.ask("w", "B", sent=h.later()) == WAIT
    assert h.ask("c", "A", sent=h.later()) == covered("w")
    h.holds.forget(KEY, "w", "B")
    assert h.ask("w2", "A", sent=h.later()) == WAIT
    assert h.finish("r", "A") == []
    assert h.ask("w2", "A") == RUN
    assert h.ask("w", "C") == covered("w2")  # the redelivery: w2's run covers it
    assert h.finish("w2", "A") == ["c", "w"]


def renewal_reports_holds_that_ran_out(h: Harness) -> None:
    assert h.ask("r", "A", lease=SHORT_LEASE) == RUN
    assert h.holds.renew(KEY, ["r"], "A", SHORT_LEASE) == []
    h.advance(PAST_SHORT_LEASE)
    assert h.holds.renew(KEY, ["r"], "A", SHORT_LEASE) == ["r"]
    assert h.ask("n", "B", sent=h.later()) == RUN
    assert h.finish("n", "B") == ["r"]  # the run that ran out passed r on


def a_key_with_nothing_left_is_forgotten(h: Harness) -> None:
    assert h.ask("r", "A") == RUN
    assert h.finish("r", "A") == []
    assert h.ask("r2", "A", sent=h.later()) == RUN
    assert h.holds.step_aside(KEY, "r2", "A", 0.0, SHORT_LEASE)
    h.advance(PAST_SHORT_LEASE)
    assert h.ask("x", "B", sent=h.later()) == RUN  # the stepped-aside hold ran out
    assert h.finish("x", "B") == ["r2"]  # and x covered it


def a_parked_waiting_run_is_made_due_when_the_run_ends(h: Harness) -> None:
    """A waiting run that outlasts the prefetch window is parked in the delay store: the
    run's end names its entry (to make it due at once), and whichever worker receives it
    is the waiting run."""
    assert h.ask("r", "A") == RUN
    assert h.ask("w", "B", sent=h.later()) == WAIT
    assert h.holds.park_wait(KEY, "w", "B", "entry-1", 20.0, LEASE)
    assert not h.holds.park_wait(KEY, "w", "B", "entry-2", 20.0, LEASE)  # not B's any more
    assert h.ask("c", "A", sent=h.later()) == covered("w")
    finished = h.holds.finish(KEY, "r", "A")
    assert finished is not None and (finished.covered, finished.parked) == ([], "entry-1")
    assert h.ask("w", "C") == RUN  # released from the delay store to C
    assert h.finish("w", "C") == ["c"]


def a_parked_waiting_run_asked_again_while_the_run_goes_on_waits_again(h: Harness) -> None:
    assert h.ask("r", "A") == RUN
    assert h.ask("w", "B", sent=h.later()) == WAIT
    assert h.holds.park_wait(KEY, "w", "B", "entry-1", 0.1, LEASE)
    assert h.ask("w", "C") == WAIT  # came back before the run ended: C holds it now
    finished = h.holds.finish(KEY, "r", "A")
    assert finished is not None and finished.parked == ""  # held by C, not parked
    assert h.ask("w", "C") == RUN
    assert h.finish("w", "C") == []


def a_waiting_run_celery_discarded_takes_what_it_covers_along(h: Harness) -> None:
    """The waiting run was revoked (Celery discarded it on arrival): it and what it covers
    are revoked together; the key is free for the next message."""
    assert h.ask("r", "A") == RUN
    assert h.ask("w", "B", sent=h.later()) == WAIT
    assert h.ask("c", "A", sent=h.later()) == covered("w")
    assert h.holds.drop(KEY, "nobody") is None
    assert h.holds.drop(KEY, "r") is None  # a running run ends by its request, not here
    assert h.holds.drop(KEY, "w").covered == ["c"]
    assert h.finish("r", "A") == []
    assert h.ask("n", "B", sent=h.later()) == RUN
    assert h.holds.step_aside(KEY, "n", "B", 5.0, LEASE)  # parked by a limit...
    assert h.holds.drop(KEY, "n").covered == []  # ...then revoked: the key is free
    assert h.ask("o", "A", sent=h.later()) == RUN
    assert h.finish("o", "A") == []


def covered_messages_keep_their_ending_until_the_run_covering_them_ends(h: Harness) -> None:
    """A covered message's ending context is kept with its id from the ask that covered it
    (a redelivery keeps it too) until the run covering it ends or is dropped, whichever
    worker ends it; a message covered by a run that ended already, a waiting run and the
    second delivery of a run keep none (they end where they are, or they run)."""
    assert h.ask("r", "A") == RUN
    assert h.ask("r", "B", context="{R}") == covered("r")  # the run delivered twice
    assert h.ask("c1", "A", sent=h.now() - 2.0, context="{c1}") == covered("r")
    assert h.ask("c1", "B", sent=h.now() - 2.0, context="{c1}") == covered("r")  # again
    assert h.ask("w", "B", sent=h.later(), context="{w}") == WAIT
    assert h.ask("c2", "A", sent=h.later(), context="{c2}") == covered("w")
    assert h.ask("c3", "A", sent=h.later()) == covered("w")  # an older worker: none
    assert h.endings("r", "A") == {"c1": "{c1}"}
    assert h.ask("w", "B") == RUN
    assert h.endings("w", "B") == {"c2": "{c2}", "c3": ""}
    verdict = h.ask("late", "B", sent=h.now() - 60.0, context="{late}")
    assert verdict == covered("w") and verdict.ended  # it ends where it is: nothing kept
    # the dead run's callers pass on with their contexts; the dead run's own id has none
    sent = h.later()  # y is sent with x, before x starts: x covers it
    assert h.ask("x", "A", lease=SHORT_LEASE, sent=sent) == RUN
    assert h.ask("y", "A", sent=sent, context="{y}") == covered("x")
    h.advance(PAST_SHORT_LEASE)
    assert h.ask("z", "B", sent=h.later()) == RUN
    assert h.endings("z", "B") == {"x": "", "y": "{y}"}
    # keep="last": the replaced waiting run is covered when it asks again
    assert h.ask("r2", "A", sent=h.later()) == RUN
    assert h.ask("w1", "B", sent=h.later(), keep="last", context="{w1}") == WAIT
    assert h.ask("c4", "A", sent=h.later(), keep="last", context="{c4}") == WAIT
    assert h.ask("w1", "B", keep="last", context="{w1}") == covered("c4")
    assert h.endings("r2", "A") == {}
    assert h.ask("c4", "A", keep="last") == RUN
    assert h.endings("c4", "A") == {"w1": "{w1}"}
    # a dropped waiting run hands its callers' contexts back
    assert h.ask("r3", "A", sent=h.later()) == RUN
    assert h.ask("w3", "B", sent=h.later()) == WAIT
    assert h.ask("c5", "A", sent=h.later(), context="{c5}") == covered("w3")
    dropped = h.holds.drop(KEY, "w3")
    assert (dropped.covered, dropped.contexts) == (["c5"], {"c5": "{c5}"})
    assert h.endings("r3", "A") == {}


SCENARIOS = [
    queued_before_any_run_runs_once,
    sent_before_a_run_started_and_delivered_after_it_ended_is_covered,
    sent_during_a_run_gives_exactly_one_more,
    sent_in_the_millisecond_a_run_started_but_after_it_is_not_covered,
    keep_last_makes_the_newest_message_the_waiting_run,
    a_dead_runs_key_frees_after_its_lease_and_its_callers_pass_on,
    a_second_delivery_of_a_live_run_is_covered_but_a_retry_goes_on,
    a_retry_is_recognised_by_its_retries_header_without_stepping_aside,
    a_forgotten_waiting_run_passes_its_callers_on,
    renewal_reports_holds_that_ran_out,
    a_key_with_nothing_left_is_forgotten,
    a_parked_waiting_run_is_made_due_when_the_run_ends,
    a_parked_waiting_run_asked_again_while_the_run_goes_on_waits_again,
    a_waiting_run_celery_discarded_takes_what_it_covers_along,
    covered_messages_keep_their_ending_until_the_run_covering_them_ends,
]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_the_table_keeps_the_rules(scenario: Callable[[Harness], None]) -> None:
    clock = FakeClock()
    table = CoalesceTable(clock)
    scenario(Harness(table, clock, clock.advance))
    assert all(not state.covered and not state.by for state in table.keys.values())
    assert all(not state.contexts for state in table.keys.values())


def test_an_idle_key_keeps_only_its_last_run_for_a_day() -> None:
    clock = FakeClock()
    table = CoalesceTable(clock)
    h = Harness(table, clock, clock.advance)
    queued_before_any_run_runs_once(h)
    (state,) = table.keys.values()
    assert state.empty() and state.last is not None and state.last.id == "m0"
    clock.advance(REMEMBER)
    assert h.ask("m1", "A", sent=clock() - REMEMBER - 10) == RUN  # forgotten: runs again
    assert h.finish("m1", "A") == []
