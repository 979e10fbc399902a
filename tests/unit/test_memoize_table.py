"""The memoize rules (:mod:`celery_extras.memoize.table`) on a fake clock.

Each scenario takes a :class:`Harness`, so ``tests/integration/test_memoize_holds.py`` runs
the same ones on the Lua form (:class:`~celery_extras.memoize.redis_memo.RedisMemo`) against
a real Redis: the two must agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from celery_extras.admission.spec import PolicyError
from celery_extras.keyed.table import KeyVerdict
from celery_extras.memoize.spec import MemoizeSpec, arguments_key
from celery_extras.memoize.table import MemoizeTable
from tests.support.clock import FakeClock

KEY = ("tasks.price", "[[1],{}]")
LEASE = 30.0
TTL = 60.0
#: a ttl (or lease) that runs out within a scenario, on a loaded machine's real store too
SHORT, PAST_SHORT = 1.0, 1.5


@dataclass
class Harness:
    """Holds under test, their clock (:meth:`now`, seconds) and a way to let time pass."""

    holds: Any
    now: Callable[[], float]
    advance: Callable[[float], None]

    def ask(self, mid: str, holder: str, *, key: tuple[str, str] = KEY, lease: float = LEASE,
            retries: int = 0, context: str = "") -> KeyVerdict:  # fmt: skip
        verdict: KeyVerdict = self.holds.ask(key, mid, holder, lease, retries, context)
        return verdict

    def finish(self, mid: str, holder: str, *, key: tuple[str, str] = KEY, kept: float = TTL,
               max_keys: int = 10) -> dict[str, str] | None:  # fmt: skip
        """The ids run *mid* covered, each with its stored context (``""``: none)."""
        done = self.holds.finish(key, mid, holder, kept, max_keys)
        return None if done is None else {one: done.contexts.get(one, "") for one in done.covered}


def joined_runs_share_one_run(h: Harness) -> None:
    assert h.ask("a", "A") == KeyVerdict("run")
    assert h.ask("b", "B", context='{"id": "b"}') == KeyVerdict("covered", "a")
    assert h.ask("c", "A") == KeyVerdict("covered", "a")
    assert h.finish("a", "A") == {"b": '{"id": "b"}', "c": ""}


def a_kept_result_covers_later_messages(h: Harness) -> None:
    h.ask("a", "A")
    h.finish("a", "A")
    for mid in ("b", "c", "d"):
        verdict = h.ask(mid, "B", context="ignored")
        assert (verdict.kind, verdict.by, verdict.ended) == ("covered", "a", True)
    assert h.ask("e", "A", key=(KEY[0], "other")).kind == "run"


def a_failure_is_not_kept(h: Harness) -> None:
    h.ask("a", "A")
    h.ask("b", "B")
    assert h.finish("a", "A", kept=0.0) == {"b": ""}  # who joined gets the failure
    assert h.ask("c", "B") == KeyVerdict("run")


def a_result_runs_again_after_its_ttl(h: Harness) -> None:
    h.ask("a", "A")
    h.finish("a", "A", kept=SHORT)
    assert h.ask("b", "B").ended
    h.advance(PAST_SHORT)
    assert h.ask("c", "B") == KeyVerdict("run")


def an_invalidated_key_runs_again(h: Harness) -> None:
    h.ask("a", "A")
    h.finish("a", "A")
    assert h.holds.invalidate(KEY) is True
    assert h.holds.invalidate(KEY) is False
    assert h.ask("b", "B") == KeyVerdict("run")
    assert h.holds.invalidate(KEY) is True  # its run in flight: not kept as it ends
    h.finish("b", "B")
    assert h.ask("c", "C") == KeyVerdict("run")


def max_keys_keeps_the_most_recently_used(h: Harness) -> None:
    keys = [(KEY[0], f"k{i}") for i in range(4)]
    for i, key in enumerate(keys[:3]):
        h.ask(f"r{i}", "A", key=key)
        h.finish(f"r{i}", "A", key=key, max_keys=3)
        h.advance(0.01)
    assert h.ask("hit0", "B", key=keys[0]).ended  # k0 used: k1 is now the least recent
    h.advance(0.01)
    h.ask("r3", "A", key=keys[3])
    h.finish("r3", "A", key=keys[3], max_keys=3)
    assert h.ask("again1", "B", key=keys[1]) == KeyVerdict("run")
    assert [h.ask(f"hit{i}", "B", key=keys[i]).ended for i in (0, 2, 3)] == [True] * 3


def a_dead_runs_messages_pass_to_the_next_run(h: Harness) -> None:
    h.ask("a", "A", lease=SHORT)
    h.ask("b", "B")
    h.advance(PAST_SHORT)
    assert h.ask("c", "C") == KeyVerdict("run")
    assert h.finish("a", "A") is None  # its hold ran out
    assert h.finish("c", "C") == {"a": "", "b": ""}


def a_run_asked_again_stays_the_run(h: Harness) -> None:
    assert h.ask("a", "A").kind == "run"
    assert h.ask("a", "A").kind == "run"  # its own ask, again (a lost reply)
    assert h.ask("a", "B") == KeyVerdict("covered", "a")  # a second delivery
    assert h.ask("a", "B", retries=1).kind == "run"  # its retry
    assert h.finish("a", "A") is None and h.finish("a", "B") == {}


SCENARIOS = [
    joined_runs_share_one_run,
    a_kept_result_covers_later_messages,
    a_failure_is_not_kept,
    a_result_runs_again_after_its_ttl,
    an_invalidated_key_runs_again,
    max_keys_keeps_the_most_recently_used,
    a_dead_runs_messages_pass_to_the_next_run,
    a_run_asked_again_stays_the_run,
]


def on_a_fake_clock() -> Harness:
    """A table on a fake clock, which the scenario moves."""
    clock = FakeClock(1000.0)

    def advance(seconds: float) -> None:
        clock.now += seconds

    return Harness(MemoizeTable(clock), clock, advance)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_the_table_keeps_the_rules(scenario: Callable[[Harness], None]) -> None:
    harness = on_a_fake_clock()
    scenario(harness)
    assert not any(state.by or state.contexts for state in harness.holds.keys.values())


def test_max_keys_bounds_what_a_task_keeps() -> None:
    table = on_a_fake_clock().holds
    for i in range(5):
        table.ask((KEY[0], str(i)), f"r{i}", "A", LEASE)
        table.finish((KEY[0], str(i)), f"r{i}", "A", TTL, 4)
    assert table.kept(KEY[0]) == 4 and len(table.keys) == 4


def test_the_default_key_is_the_arguments_canonically_encoded() -> None:
    assert arguments_key((1, "a"), {"b": 2, "a": [1]}) == '[[1,"a"],{"a":[1],"b":2}]'
    same = arguments_key((1, "a"), {"b": 2, "a": (1,)})
    assert arguments_key([1, "a"], {"a": [1], "b": 2}) == same


@pytest.mark.parametrize("args, error", [
    ((0, None, 10, 30.0), "ttl 0"),
    ((5, "k", 10, 30.0), "key 'k'"),
    ((5, None, 0, 30.0), "max_keys 0"),
    ((5, None, True, 30.0), "max_keys True"),
    ((5, None, 10, 0.5), "lease 0.5"),
])  # fmt: skip
def test_a_bad_argument_names_the_task_and_itself(args: tuple[Any, ...], error: str) -> None:
    with pytest.raises(PolicyError, match=f"memoize\\(\\) on task 't': {error}"):
        MemoizeSpec.build("t", *args)
