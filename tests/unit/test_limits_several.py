"""Several limits on one task, cost and shadow mode, decided by the planner on a fake clock.

The rule (``celery_extras.limits.all_of``): a task runs when every limit admits it; all are
taken at once, or only the limit that makes it wait longest books its slot and the others
are asked again when it comes (a token held is kept). A brute-force model checks it over
random limits, costs and arrivals: every limit's bookings fit its token bucket (in every
window, tokens <= burst + rate x length), every token handed out goes to exactly one run,
booked for the run's instant or before it (never after: no run is early), each run is
held at most one slot per limit, and every task runs.
"""

from __future__ import annotations

import heapq
import itertools
import math
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_extras import limit
from celery_extras.admission.spec import PolicyError
from celery_extras.bounds import MAX_WAIT
from celery_extras.limits.planner import LimitPlanner
from celery_extras.limits.spec import LimitSpec, limit_id
from celery_extras.limits.token_bucket import TokenBucket
from tests.support.clock import FakeClock
from tests.support.fake_global import FakeGlobal

SETTINGS = {"delay_max_hold": 1e9, "limit_on_store_error": "local", "store_retry": 1.0}
EPS = 1e-6


class RecordingBucket(TokenBucket):
    """A token bucket that records each booking: ``(when the tokens are used, tokens)``."""

    def __init__(self, rate: float, burst: int, clock: Any) -> None:
        super().__init__(rate, burst, clock)
        self.taken: list[tuple[float, int]] = []

    def reserve(self, tokens: int = 1, max_wait: float = math.inf) -> float:
        wait = super().reserve(tokens, max_wait)
        if wait <= max_wait:
            self.taken.append((self.clock() + wait, tokens))
        return wait


def fits(uses: list[tuple[float, int]], rate: float, burst: int) -> bool:
    """Brute force: in every window [t_i, t_j], the tokens used are <= burst + rate x length."""
    uses = sorted(uses)
    for i, j in itertools.combinations_with_replacement(range(len(uses)), 2):
        tokens = sum(n for _, n in uses[i : j + 1])
        if tokens > burst + rate * (uses[j][0] - uses[i][0]) + EPS:
            return False
    return True


def request(*costs: int) -> Any:
    return SimpleNamespace(args=costs, kwargs={})


def cost_at(index: int) -> Any:
    return lambda args, kwargs: args[index]


def planner_with(*specs: LimitSpec, clock: FakeClock) -> LimitPlanner:
    planner = LimitPlanner(SETTINGS, lambda: FakeGlobal(clock), clock)  # type: ignore[arg-type, return-value]
    planner.register("t", specs)
    return planner


LIMITS = st.lists(
    st.tuples(st.sampled_from([1.0, 2.0, 5.0, 10.0, 40.0]), st.integers(1, 3),
              st.sampled_from(["worker", "global", "per key"])),
    min_size=1, max_size=3,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(limits=LIMITS, data=st.data())
def test_several_limits_against_a_brute_force_model(
    limits: list[tuple[float, int, str]], data: st.DataObject
) -> None:
    """Worker, global and per-key (one key: "k") limits, each task taking a drawn cost of
    each; the store is the Lua script's rule on the fake clock."""
    clock = FakeClock(1000.0)
    specs = [
        LimitSpec(rate, burst, "worker" if kind == "worker" else "global",
                  (lambda a, k: "k") if kind == "per key" else None, f"{rate}/s", cost_at(i))
        for i, (rate, burst, kind) in enumerate(limits)
    ]  # fmt: skip
    planner = planner_with(*specs, clock=clock)
    store: FakeGlobal = planner.global_bucket()  # type: ignore[assignment]
    buckets = []
    for i, (rate, burst, kind) in enumerate(limits):
        bucket = RecordingBucket(rate, burst, clock)
        if kind == "worker":
            planner.local[(limit_id("t", i), "")] = bucket
        else:
            store.buckets[(limit_id("t", i), "k" if kind == "per key" else "")] = bucket
        buckets.append(bucket)
    costs = st.tuples(*(st.integers(0, burst) for _, burst, _ in limits))
    tasks = data.draw(st.lists(st.tuples(st.integers(0, 3000), costs), min_size=1, max_size=30))

    # the gate, as a loop of timer events: (time, seq, task, booking)
    events = [(1000.0 + ms / 1000, n, n, None) for n, (ms, _) in enumerate(tasks)]
    heapq.heapify(events)
    seq = itertools.count(len(events))
    runs: dict[int, float] = {}
    holds = [0] * len(tasks)
    for _ in range(100_000):
        if not events:
            break
        clock.now, _, task, booking = heapq.heappop(events)
        task_costs = tasks[task][1]
        if booking is not None:
            plan = planner.plan(
                "t", request(*task_costs), booking.due, booking.limit, booking.taken
            )
        else:
            plan = planner.plan("t", request(*task_costs))
        if plan.action == "run":
            runs[task] = clock.now
            continue
        assert plan.action in ("hold", "park") and plan.booked and plan.wait <= MAX_WAIT
        holds[task] += 1
        heapq.heappush(events, (plan.due, next(seq), task, plan))

    assert not events and set(runs) == set(range(len(tasks)))  # every task ran
    first = min(range(len(tasks)), key=lambda n: (tasks[n][0], n))
    assert runs[first] == 1000.0 + tasks[first][0] / 1000  # an idle limit set admits at once
    assert max(holds) <= len(limits)  # at most one slot of each limit
    for i, ((rate, burst, _), bucket) in enumerate(zip(limits, buckets, strict=True)):
        assert fits(bucket.taken, rate, burst), (i, bucket.taken)
        used = sorted((runs[n], c[i]) for n, (_, c) in enumerate(tasks) if c[i])
        assert sum(n for _, n in bucket.taken) == sum(n for _, n in used)  # none lost
        # no run is early: by any run's instant, the tokens booked up to then cover those used
        for when, _ in used:
            booked = sum(n for t, n in bucket.taken if t <= when + EPS)
            assert booked >= sum(n for t, n in used if t <= when), (i, bucket.taken, used)


def test_the_lower_of_two_stacked_limits_holds_and_the_other_is_not_used_up() -> None:
    """A per-customer limit under a global one: one customer's backlog waits on its own
    limit and leaves the global one to the others."""
    clock = FakeClock()
    per_key = LimitSpec(5.0, 1, "global", lambda a, k: a[0], "5/s")
    planner = planner_with(LimitSpec(100.0, 1, "global", None, "100/s"), per_key, clock=clock)
    plans = [planner.plan("t", request("a")) for _ in range(10)]  # customer a: a backlog
    assert [p.action for p in plans] == ["run"] + ["hold"] * 9
    assert [p.held_by for p in plans[1:]] == [1] * 9 and plans[9].wait == pytest.approx(1.8)
    # the global 100/s was taken once: customer b waits one 100/s interval, not for a's
    b = planner.plan("t", request("b"))
    assert (b.action, b.wait, b.held_by) == ("hold", pytest.approx(0.01), 0)
    clock.now += 0.01
    assert planner.plan("t", request("b"), b.due, b.limit, b.taken).action == "run"
    assert planner.plan("t", request("b")).held_by == 1  # b's own 5/s now


def run_backlog(planner: LimitPlanner, clock: FakeClock, n: int) -> list[float]:
    """When each of *n* tasks of one customer, sent at once, starts: each held task is
    asked again when its slot comes, as the worker does."""
    starts = []
    for _ in range(n):
        plan = planner.plan("t", request("a"))
        while plan.action == "hold":
            clock.now += plan.wait
            plan = planner.plan("t", request("a"), plan.due, plan.limit, plan.taken)
        assert plan.action == "run"
        starts.append(clock.now)
    return starts


def test_the_docs_hourly_quota_over_a_per_customer_limit_runs_at_the_per_customer_rate() -> None:
    """docs/policies.rst's example, as written there: the quota's burst lets one customer
    run at its 10/s (with the default burst of 1, the quota held it to one per 0.36 s)."""
    from celery import Celery

    from celery_extras.admission.registry import policies_of

    text = (Path(__file__).parents[2] / "docs" / "policies.rst").read_text()
    block = text[: text.index("def call_api(")].rsplit("::\n\n", 1)[1] + "def call_api(c, q): ..."
    assert "# an API's hourly quota" in block
    app = Celery("docs", set_as_current=False)
    names: dict[str, Any] = {"limit": limit, "app": app}
    exec(textwrap.dedent(block), names)
    declared = policies_of(app.tasks[names["call_api"].name])
    assert declared is not None
    clock = FakeClock()
    starts = run_backlog(planner_with(*declared.limits, clock=clock), clock, 30)  # 10/s
    assert [t - starts[0] for t in starts] == pytest.approx([i / 10 for i in range(30)])


def test_global_and_worker_limits_mixed_book_in_one_store_call() -> None:
    clock = FakeClock()
    planner = planner_with(
        LimitSpec(10.0, 1, "global", None, "10/s"),
        LimitSpec(2.0, 1, "worker", None, "2/s"),
        LimitSpec(4.0, 1, "global", None, "4/s", shadow=True),
        clock=clock,
    )
    store: FakeGlobal = planner.global_bucket()  # type: ignore[assignment]
    assert planner.plan("t", request()).action == "run" and store.calls == 1
    second = planner.plan("t", request())
    assert (second.action, second.wait, second.held_by) == ("hold", 0.5, 1)  # the 2/s binds
    assert store.calls == 2 and store.buckets[("t", "")].expected_time() == pytest.approx(0.1)
    clock.now += 0.5  # its slot came: the 10/s is asked again, and taken
    assert planner.plan("t", request(), second.due, second.limit, second.taken).action == "run"
    assert store.calls == 3


def test_a_cost_takes_that_many_tokens_and_zero_takes_none() -> None:
    clock = FakeClock()
    planner = planner_with(LimitSpec(20.0, 2, "worker", None, "20/s", cost=2), clock=clock)
    waits = [planner.plan("t", request()).wait for _ in range(4)]
    assert waits == pytest.approx([0.0, 0.1, 0.2, 0.3])  # 10 tasks a second
    free = planner_with(LimitSpec(1.0, 1, "worker", None, "1/s", cost=cost_at(0)), clock=clock)
    assert [free.plan("t", request(0)).action for _ in range(5)] == ["run"] * 5
    assert free.plan("t", request(1)).action == "run"
    assert free.plan("t", request(1)).action == "hold"


@pytest.mark.parametrize(("cost", "why"), [
    (3, "cost 3 is above the burst (2)"), ("2", "cost '2': expected an integer from 0 to the "
    "burst (2)"), (True, "cost True"), (-1, "cost -1")])  # fmt: skip
def test_a_cost_the_burst_cannot_give_is_refused_naming_task_cost_and_burst(
    cost: Any, why: str
) -> None:
    with pytest.raises(PolicyError, match=r"limit\(\) on task 'a\.b'") as raised:
        LimitSpec.build("a.b", "20/s", 2, "global", None, cost)
    assert why in str(raised.value)
    # per call: the task fails at arrival with the same reason, nothing taken, nothing waits
    clock = FakeClock()
    planner = planner_with(LimitSpec(20.0, 2, "worker", None, "20/s", cost_at(0)), clock=clock)
    plan = planner.plan("t", request(cost))
    assert plan.action == "refuse"
    assert plan.error.startswith("task t, limit() 20/s: ") and why in plan.error
    assert planner.plan("t", request(2)).action == "run"  # the bucket was left full


def test_stacked_decorators_keep_every_limit_top_first() -> None:
    from celery import Celery

    app = Celery("several", set_as_current=False)

    @limit("100/s")
    @limit("5/s", burst=2, key=lambda a, k: a[0], cost=2, shadow=True)
    @app.task(name="several.t")
    def task(customer: str) -> None: ...

    from celery_extras.admission.registry import policies_of

    declared = policies_of(app.tasks["several.t"])
    assert declared is not None
    assert [(s.text, s.cost, s.shadow) for s in declared.limits] == [("100/s", 1, False),
                                                                     ("5/s", 2, True)]  # fmt: skip
    with pytest.raises(PolicyError, match="shadow 'yes': expected True or False"):
        LimitSpec.build("several.t", "1/s", None, "global", None, shadow="yes")


def test_a_shadow_limit_never_delays_and_counts_what_it_would_have_held() -> None:
    clock = FakeClock()
    planner = planner_with(LimitSpec(5.0, 1, "worker", None, "5/s", shadow=True), clock=clock)
    plans = [planner.plan("t", request()) for _ in range(30)]
    assert all(p.action == "run" for p in plans)
    shadowed = [p.shadowed for p in plans]
    assert shadowed[0] == () and sum(1 for s in shadowed if s) == 29  # a real 5/s: 29 held
    assert shadowed[29] == ((0, pytest.approx(29 * 0.2)),)  # and the wait it would impose


def test_every_limit_shadow_with_the_setting() -> None:
    clock = FakeClock()
    planner = LimitPlanner({**SETTINGS, "limits_shadow": True}, lambda: FakeGlobal(clock), clock)  # type: ignore[arg-type, return-value]
    planner.register("t", (LimitSpec(5.0, 1, "global", None, "5/s"),
                           LimitSpec(1.0, 1, "worker", None, "1/s")))  # fmt: skip
    plans = [planner.plan("t", request()) for _ in range(3)]
    assert [p.action for p in plans] == ["run"] * 3
    assert [len(p.shadowed) for p in plans] == [0, 2, 2]


def test_a_rate_for_one_key_changes_that_key_only() -> None:
    clock = FakeClock()
    per_key = LimitSpec(1.0, 1, "worker", lambda a, k: a[0], "1/s")
    planner = planner_with(per_key, clock=clock)
    assert planner.set_limit("t", "10/s", key="gold") == "t for key 'gold': 10/s (burst 1, worker)"
    gold = [planner.plan("t", request("gold")).wait for _ in range(3)]
    basic = [planner.plan("t", request("basic")).wait for _ in range(3)]
    assert gold == pytest.approx([0.0, 0.1, 0.2]) and basic == pytest.approx([0.0, 1.0, 2.0])
    assert "back to 1/s" in planner.reset_limit("t", key="gold")
    assert [planner.plan("t", request("gold")).wait for _ in range(2)] == pytest.approx([0.3, 1.3])
    with pytest.raises(ValueError, match="key 5: expected a bucket key"):
        planner.set_limit("t", "10/s", key=5)


def test_a_task_with_several_limits_names_the_one_a_rate_is_for() -> None:
    clock = FakeClock()
    planner = planner_with(LimitSpec(100.0, 1, "worker", None, "100/s"),
                           LimitSpec(5.0, 1, "worker", None, "5/s"), clock=clock)  # fmt: skip
    with pytest.raises(ValueError, match=r"task t has 2 limit\(\)s; name one of them by its "
                       r"place, top first \(1: 100/s, 2: 5/s\)"):  # fmt: skip
        planner.set_limit("t", "1/s")
    assert planner.set_limit("t", "1/s", limit=2) == "t#2: 1/s (burst 1, worker)"
    assert planner.plan("t", request()).action == "run"
    assert planner.plan("t", request()).wait == pytest.approx(1.0)


def test_a_worker_limit_parks_long_waits_without_booking_its_own_bucket() -> None:
    """A worker's bucket is its own: a wait longer than the hold is parked with no slot in
    it (another worker may receive the task back); a schedule spreads the returns at
    twice the rate, after the slots held in the worker."""
    clock = FakeClock()
    planner = LimitPlanner({**SETTINGS, "delay_max_hold": 1.0}, lambda: FakeGlobal(clock), clock)  # type: ignore[arg-type, return-value]
    planner.register("t", LimitSpec(2.0, 1, "worker", None, "2/s"))
    plans = [planner.plan("t", request()) for _ in range(6)]
    assert [(p.action, p.booked) for p in plans] == [("run", True), ("hold", True), ("hold", True),
                                                     ("park", False), ("park", False),
                                                     ("park", False)]  # fmt: skip
    # no sooner than the bucket's own wait, at twice the rate (they come back to any worker)
    assert [p.wait for p in plans[3:]] == pytest.approx([1.5, 1.5, 1.75])
    assert planner.local[("t", "")].booked_until() == pytest.approx(clock.now + 1.0)
    # a parked one released to a worker whose bucket is free runs there at once
    other = planner_with(LimitSpec(2.0, 1, "worker", None, "2/s"), clock=clock)
    clock.now += 1.5
    assert other.plan("t", request()).action == "run"


def test_park_kinds_name_the_limit_whose_slot_the_store_verifies() -> None:
    from celery import Celery

    import celery_extras
    from celery_extras.delay.gate import slot_of_kind
    from celery_extras.limits.gate import LimitGate
    from celery_extras.limits.planner import Plan

    gate = LimitGate(celery_extras.install(Celery("kinds", set_as_current=False)), SETTINGS)
    gate.planner.register("t", (LimitSpec(10.0, 1, "global", None, "10/s"),
                                LimitSpec(5.0, 1, "global", None, "5/s"),
                                LimitSpec(2.0, 1, "worker", None, "2/s")))  # fmt: skip
    parks = [Plan(action="park", wait=9.0, booked=True, due=9.0, limit=i) for i in range(3)]
    kinds = [gate._park_kind("t", plan) for plan in parks]
    assert kinds == ["limit", "limit:1", "limit:worker"]
    # the limits it holds a token of already (booked at arrival) go with it
    held = gate._park_kind(
        "t", Plan(action="park", wait=9.0, booked=True, due=9.0, limit=1, taken=frozenset({0, 2}))
    )
    assert held == "limit:1/0,2"
    assert [slot_of_kind(k) for k in (*kinds, held, "retry", "eta", "limit:x", "limit:1234")] == [
        (0, frozenset()),
        (1, frozenset()),
        None,
        (1, frozenset({0, 2})),
        None,
        None,
        None,
        None,
    ]
    # hostile store contents: a malformed or huge held list holds nothing (asked again)
    assert slot_of_kind("limit/1,x") == (0, frozenset())
    assert slot_of_kind("limit/" + ",".join(["1"] * 33)) == (0, frozenset())
    assert slot_of_kind("limit:2/2,3") == (2, frozenset({3}))
    # digits int() cannot read (str.isdigit accepts them): no crash of the arrival gate
    assert slot_of_kind("limit:\u00b2") is None
    assert slot_of_kind("limit/\u00b2") == (0, frozenset())
