"""The chaos checker's verdicts on made-up histories, and its workloads' determinism: each
promise it holds the workers to is shown broken once, and told from Celery's own."""

from __future__ import annotations

from typing import Any

from tests.chaos.checker import History, Window, check
from tests.chaos.workload import Node, Send, Workload, generate


def history(nodes: list[Node], entries: list[dict[str, Any]], **kwargs: Any) -> History:
    work = Workload(1, 60.0, "prefork", 2, [Send(0.0, 0, "group", tuple(nodes))])
    results = kwargs.pop("results", {n.id: ("SUCCESS", {"run": n.id}) for n in nodes})
    sent = kwargs.pop("sent", dict.fromkeys((n.id for n in nodes), 100.0))
    return History(work, sent, entries, results, **kwargs)


def node(i: int, task: str = "chaos.plain") -> Node:
    return Node(f"id{i}", task, "k0", i, 0.0)


def start(i: int, t: float, worker: str = "w0", task: str = "chaos.plain", **more: Any
          ) -> dict[str, Any]:  # fmt: skip
    return {"task": task, "id": f"id{i}", "t": t, "worker": worker, "retries": 0,
            "phase": "start", **more}  # fmt: skip


def end(i: int, t: float, **more: Any) -> dict[str, Any]:
    return {**start(i, t, **more), "phase": "end"}


def kinds(found: list[Any]) -> list[tuple[str, str]]:
    return [(v.check, v.owner) for v in found]


def test_a_quiet_history_breaks_nothing() -> None:
    nodes = [node(1), node(2)]
    entries = [start(1, 101.0), end(1, 101.1), start(2, 101.0), end(2, 101.2)]
    assert check(history(nodes, entries)) == []


def test_a_body_twice_under_one_id_is_ours_unless_its_first_worker_was_killed() -> None:
    entries = [start(1, 101.0, "w0"), start(1, 105.0, "w1"), end(1, 105.1)]
    assert kinds(check(history([node(1)], entries))) == [("ran twice", "celery-extras")]
    killed = [Window("kill", 102.0, 102.0, "w0")]
    assert kinds(check(history([node(1)], entries, windows=killed))) == [
        ("ran again after SIGKILL", "celery")
    ]
    other = [Window("kill", 102.0, 102.0, "w1")]  # the wrong worker: no excuse
    assert kinds(check(history([node(1)], entries, windows=other))) == [
        ("ran twice", "celery-extras")
    ]


def test_a_retry_is_another_attempt_not_a_second_body() -> None:
    entries = [start(1, 101.0), {**start(1, 102.0), "retries": 1}, end(1, 102.1, retries=1)]
    assert check(history([node(1)], entries)) == []


def test_a_message_without_a_final_state_is_lost_and_a_failure_reported() -> None:
    nodes = [node(1), node(2)]
    results = {"id2": ("FAILURE", {"exc_type": "ValueError"})}
    found = check(history(nodes, [start(2, 101.0)], results=results))
    assert kinds(found) == [("lost", "celery-extras"), ("failed", "celery-extras")]
    # kombu#305: popped by a SIGKILLed worker's BRPOP as it died, never booked as unacked
    found = check(history(nodes, [start(2, 101.0)], results=results, in_transit={"id1"}))
    assert kinds(found)[0] == ("lost", "celery")
    # a send that raised (the broker was down): maybe never sent, not lost
    found = check(history(nodes, [start(2, 101.0)], results=results, unsent={"id1"}))
    assert kinds(found) == [("failed", "celery-extras")]


def test_a_limit_beyond_its_burst_is_ours_unless_the_store_was_away() -> None:
    nodes = [node(i, "chaos.limited") for i in range(30)]
    entries = [start(i, 101.0 + i * 0.01, task="chaos.limited") for i in range(30)]
    rates = {"chaos.limited": (20.0, 2)}
    assert kinds(check(history(nodes, entries, rates=rates))) == [("limit", "celery-extras")]
    stall = [Window("store_stall", 100.0, 102.0)]
    found = check(history(nodes, entries, rates=rates, windows=stall))
    assert kinds(found) == [("limit", "fallback")]
    spaced = [start(i, 101.0 + i * 0.05, task="chaos.limited") for i in range(30)]
    assert check(history(nodes, spaced, rates=rates)) == []


def test_a_cap_exceeded_is_ours() -> None:
    nodes = [node(i, "chaos.capped") for i in range(4)]
    entries = [start(i, 101.0, task="chaos.capped") for i in range(4)]
    entries += [end(i, 102.0, task="chaos.capped") for i in range(4)]
    found = check(history(nodes, entries, caps={"chaos.capped": 3}))
    assert kinds(found) == [("cap", "celery-extras")]
    assert check(history(nodes, entries, caps={"chaos.capped": 4})) == []


def test_a_body_run_again_after_a_broker_restart_holds_no_slot_between_seed_665725() -> None:
    """Seed 665725: ``id0`` ran from 101.0 to 101.1, lost its ack with a restarted broker and
    ran again 30 s later; two others ran at 105. Each body ends at its own end: no cap of 2
    was exceeded (the checker paired both starts with the last end, and saw 3 at once)."""
    nodes = [node(i, "chaos.several") for i in range(3)]
    entries = [start(0, t, task="chaos.several") for t in (101.0, 131.0)]
    entries += [end(0, t, task="chaos.several") for t in (101.1, 131.1)]
    entries += [start(i, 105.0, worker="w1", task="chaos.several") for i in (1, 2)]
    entries += [end(i, 105.1, worker="w1", task="chaos.several") for i in (1, 2)]
    restarted = [Window("broker_restart", 101.05, 104.0)]
    found = check(history(nodes, entries, caps={"chaos.several": 2}, windows=restarted))
    assert kinds(found) == [("ran again after a broker restart", "celery")]
    entries.append(start(3, 105.05, worker="w0", task="chaos.several"))  # a third at once
    found = check(history(nodes, entries, caps={"chaos.several": 2}, windows=restarted))
    assert [v.detail for v in found if v.check == "cap"] == [
        "chaos.several: 3 running at 105.050 for concurrency(2): id1 attempt 0 on w1 "
        "105.000-105.100; id2 attempt 0 on w1 105.000-105.100; id3 attempt 0 on w0 "
        "105.050-165.050"
    ]


def test_a_cap_exceeded_during_a_store_stall_hides_no_later_excess_seed_104379() -> None:
    """Seed 104379: a ``concurrency(2)`` ran 3 at once in a store stall (the fallback's), then
    came a broker restart; an excess after it is still ours (the checker stopped at the
    first excess)."""
    nodes = [node(i, "chaos.several") for i in range(6)]
    entries = [start(i, 101.0, task="chaos.several") for i in range(3)]
    entries += [end(i, 101.1, task="chaos.several") for i in range(3)]
    entries += [start(i, 120.0, task="chaos.several") for i in range(3, 6)]
    entries += [end(i, 120.1, task="chaos.several") for i in range(3, 6)]
    stall = [Window("store_stall", 100.0, 101.5), Window("broker_restart", 110.0, 113.0)]
    found = check(history(nodes, entries, caps={"chaos.several": 2}, windows=stall))
    assert kinds(found) == [("cap", "fallback"), ("cap", "celery-extras")]
    assert found[1].detail.startswith("chaos.several: 3 running at 120.000 for concurrency(2): ")


def test_a_coalesced_message_answered_by_an_older_run_is_a_lost_update() -> None:
    nodes = [node(1, "chaos.coalesced"), node(2, "chaos.coalesced")]
    entries = [start(1, 99.0, task="chaos.coalesced")]
    results = {n.id: ("SUCCESS", {"run": "id1"}) for n in nodes}
    found = check(history(nodes, entries, results=results, sent={"id1": 98.9, "id2": 100.0}))
    assert kinds(found) == [("lost update", "celery-extras")]
    results["id2"] = ("SUCCESS", {"run": "nowhere"})
    found = check(history(nodes, entries, results=results, sent={"id1": 98.9, "id2": 100.0}))
    assert kinds(found) == [("covering run", "celery-extras")]


def test_a_batched_call_in_two_batches_is_ours_unless_a_worker_was_killed() -> None:
    nodes = [node(1, "chaos.batched")]
    entries = [end(0, 101.0, task="chaos.batched", calls=["id1"]),
               end(0, 102.0, task="chaos.batched", calls=["id1"])]  # fmt: skip
    assert kinds(check(history(nodes, entries))) == [("batch", "celery-extras")]
    killed = [Window("kill", 101.5, 101.5, "w0")]
    assert kinds(check(history(nodes, entries, windows=killed))) == [("batch", "celery")]
    restarted = [Window("broker_restart", 101.5, 102.5)]  # its ack lost with the connection
    assert kinds(check(history(nodes, entries, windows=restarted))) == [("batch", "celery")]


def test_a_worker_silent_outside_a_fault_is_ours() -> None:
    pings = [(100.0 + i, "w0", i < 3) for i in range(20)]
    assert kinds(check(history([], [], pings=pings))) == [("silent", "celery-extras")]
    paused = [Window("store_pause", 102.0, 104.0)]
    assert check(history([], [], pings=pings, windows=paused)) == []


def test_a_seed_gives_the_same_workload_and_faults() -> None:
    one, two = generate(7, 60.0), generate(7, 60.0)
    assert one == two and one.sends and one.faults
    assert generate(8, 60.0) != one
    assert all(5.0 <= f.at <= 50.0 for f in one.faults)


def test_a_retry_state_over_a_finished_retry_is_celerys_race_else_lost() -> None:
    """Celery publishes a retry, then stores RETRY after checking the state is not SUCCESS
    (two calls): a retry run fast by another worker can end in between (seed 104)."""
    results = {"id1": ("RETRY", None)}
    retried = [start(1, 101.0), {**end(1, 101.5), "retries": 1}]
    found = check(history([node(1)], retried, results=results))
    assert kinds(found) == [("RETRY over SUCCESS", "celery")]
    found = check(history([node(1)], [start(1, 101.0)], results=results))
    assert kinds(found) == [("lost", "celery-extras")]


def test_a_chain_step_whose_publish_met_a_broker_restart_is_celerys() -> None:
    """The worker publishes a chain's next step as the previous one ends; with the broker
    restarting then, Celery's publish gives up after its retries."""
    nodes = [node(1), node(2)]
    work = Workload(1, 60.0, "prefork", 2, [Send(0.0, 0, "chain", tuple(nodes))])
    entries = [start(1, 101.0), end(1, 101.1)]
    results = {"id1": ("SUCCESS", {"run": "id1"})}
    lost = History(work, {"id1": 100.0, "id2": 100.0}, entries, results)
    assert kinds(check(lost)) == [("lost", "celery-extras")]
    lost.windows = [Window("broker_restart", 101.0, 103.0)]
    assert kinds(check(lost)) == [("lost", "celery")]


def test_a_chain_step_after_a_step_that_never_ended_is_not_lost_twice() -> None:
    """Its previous step's loss (reported, Celery's here) is why it was never published."""
    nodes = [node(1), node(2), node(3)]
    work = Workload(1, 60.0, "prefork", 2, [Send(0.0, 0, "chain", tuple(nodes))])
    lost = History(work, dict.fromkeys(("id1", "id2", "id3"), 100.0), [], {},
                   in_transit={"id1"})  # fmt: skip
    assert kinds(check(lost)) == [("lost", "celery")]


def test_a_chain_step_published_again_by_its_step_run_again_is_celerys_seed_277911() -> None:
    """Seed 277911: a chain's step (batched there) ran in a worker SIGKILLed before its ack,
    then again in the survivor; each run published the chain's next step (a ``capped`` one),
    which so ran twice, and so did the step after it. More runs than what it follows
    succeeded are ours."""
    nodes = [node(1), node(2, "chaos.capped"), node(3)]
    work = Workload(1, 60.0, "prefork", 2, [Send(0.0, 0, "chain", tuple(nodes))])
    entries = [start(1, 101.0, "w0"), start(1, 103.0, "w1"), end(1, 103.1, worker="w1")]
    entries += [end(1, 101.1)]  # the killed worker's run succeeded, unacked
    entries += [start(2, t, "w1") for t in (101.2, 103.2)]
    entries += [end(2, t, worker="w1") for t in (101.3, 103.3)]
    entries += [start(3, t, "w1") for t in (101.4, 103.4)]
    entries += [end(3, t, worker="w1") for t in (101.5, 103.5)]
    killed = [Window("kill", 101.15, 101.15, "w0")]
    sent = dict.fromkeys((n.id for n in nodes), 100.0)
    results = {n.id: ("SUCCESS", {"run": n.id}) for n in nodes}
    found = check(History(work, sent, entries, results, windows=killed))
    assert kinds(found) == [
        ("ran again after SIGKILL", "celery"),
        ("published again as what it follows ran again", "celery"),
        ("published again as what it follows ran again", "celery"),
    ]
    entries.append(start(3, 104.0, "w1"))  # a third run: more than its step's two
    found = check(History(work, sent, entries, results, windows=killed))
    assert kinds(found)[-1] == ("ran twice", "celery-extras")


def test_a_chord_callback_celery_could_not_publish_in_an_outage_is_celerys_seed_36348() -> None:
    """Seed 36348: a chord's last header part ended as the broker went down; Celery gave up
    publishing its callback after 3 tries and stored ``ChordError`` ("Callback error:
    OperationalError('[Errno 111] ECONNREFUSED')", no "connection" in its text) as the
    callback's result. Without an outage the same failure is ours."""
    nodes = [node(1), node(2), node(3, "chaos.coalesced")]
    work = Workload(1, 60.0, "prefork", 2, [Send(0.0, 0, "chord", tuple(nodes))])
    entries = [start(1, 101.0), end(1, 101.1), start(2, 101.0), end(2, 110.1)]
    error = {
        "exc_type": "ChordError",
        "exc_message": ["Callback error: OperationalError('[Errno 111] ECONNREFUSED')"],
    }
    results = {"id1": ("SUCCESS", {}), "id2": ("SUCCESS", {}), "id3": ("FAILURE", error)}
    sent = dict.fromkeys((n.id for n in nodes), 100.0)
    restarted = [Window("broker_restart", 110.0, 113.0)]
    found = check(History(work, sent, entries, results, windows=restarted))
    assert kinds(found) == [("failed", "celery")]
    assert kinds(check(History(work, sent, entries, results))) == [  # no outage: ours
        ("failed", "celery-extras")
    ]


def test_a_covering_run_that_ran_again_is_judged_by_its_last_body_seed_646042() -> None:
    """Seed 646042: coalescing run ``id1`` ran at 101.0 (before ``id2`` was sent, at 103.0),
    lost its ack with a restarted broker, ran again at 106.0 and covered ``id2``: no lost
    update. Had it not run again after 103.0, ``id2`` would have one."""
    nodes = [node(1, "chaos.coalesced"), node(2, "chaos.coalesced")]
    entries = [start(1, t, task="chaos.coalesced") for t in (101.0, 106.0)]
    entries += [end(1, t, task="chaos.coalesced") for t in (101.1, 106.1)]
    results = {n.id: ("SUCCESS", {"run": "id1"}) for n in nodes}
    sent = {"id1": 100.0, "id2": 103.0}
    restarted = [Window("broker_restart", 101.05, 104.0)]
    found = check(history(nodes, entries, results=results, sent=sent, windows=restarted))
    assert kinds(found) == [("ran again after a broker restart", "celery")]
    entries = [e for e in entries if e["t"] < 106.0]  # one body, before id2 was sent
    found = check(history(nodes, entries, results=results, sent=sent, windows=restarted))
    assert kinds(found) == [("lost update", "celery-extras")]


def test_a_chain_celery_failed_in_an_outage_fails_every_later_step_as_celerys_seed_758327(
) -> None:  # fmt: skip
    """Seed 758327: a chain's step ran as the broker restarted, and Celery could not publish
    the next: it failed that step and every step after it with the same ``OperationalError``
    (``ECONNREFUSED``, which the checker did not read as a lost connection). The step two
    after the one that ran is Celery's too."""
    nodes = [node(1), node(2), node(3)]
    work = Workload(1, 60.0, "prefork", 2, [Send(0.0, 0, "chain", tuple(nodes))])
    entries = [start(1, 110.0), end(1, 110.1)]
    error = {"exc_type": "OperationalError", "exc_message": ["[Errno 111] ECONNREFUSED"]}
    results = {"id1": ("FAILURE", error), "id2": ("FAILURE", error), "id3": ("FAILURE", error)}
    sent = dict.fromkeys((n.id for n in nodes), 100.0)
    restarted = [Window("broker_restart", 110.0, 113.0)]
    found = check(History(work, sent, entries, results, windows=restarted))
    assert kinds(found) == [("failed", "celery")] * 3
    results = {n.id: ("FAILURE", error) for n in nodes}  # no broker restart: ours
    assert kinds(check(History(work, sent, entries, results))) == [("failed", "celery-extras")] * 3
