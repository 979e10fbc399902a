"""Coalescing on real prefork workers, on Redis and on RabbitMQ (store: Redis).

Every run journals its start and end (written by the pool processes on the one host
clock) and returns its own id, so "one run at a time", "a run after every message" and
"every caller's result is its covering run's" are checked from the stamps and results.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celery
import pytest
from celery import Celery, chain, chord
from celery.result import AsyncResult

# imported here too: this process is the producer, and a producer stamps the send time on
# the messages of the coalesced tasks it knows (by name only, a message counts as sent when
# it reached a worker)
import tests.support.tasks_canvas
import tests.support.tasks_coalesce
from celery_extras.admission.sent import SENT_HEADER
from celery_extras.coalesce.redis_holds import RedisHolds
from celery_extras.store.client import redis_client, store_key
from tests.integration.conftest import Cluster
from tests.integration.test_stats_cli import extras
from tests.support.brokers import PrivateRedis
from tests.support.journal import Journal
from tests.support.outages import store_outages
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_coalesce",)
PER_KEY = "tests.coalesce.per_key"
CRASHY = "tests.coalesce.crashy"


def runs_of(journal: Journal, task: str) -> list[dict[str, Any]]:
    return [e for e in journal.entries() if e["task"] == task and e.get("phase") == "end"]


def started(journal: Journal, task: str, tag: Any) -> dict[str, Any]:
    for entry in journal.entries():
        if entry["task"] == task and entry.get("phase") == "start" and entry.get("tag") == tag:
            return entry
    return {}


def coalesce_info(cluster: Cluster, hostname: str) -> dict[str, Any]:
    stats = cluster.app.control.inspect(destination=[hostname], timeout=3).stats() or {}
    info: dict[str, Any] = stats.get(hostname, {}).get("extras_policies", {}).get("coalesce", {})
    return info


def overlaps(runs: list[dict[str, Any]]) -> int:
    """Pairs of runs (of one key) open at once."""
    spans = sorted((e["start"], e["t"]) for e in runs)
    return sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])


def test_queued_twenty_times_runs_once_and_ten_during_a_run_give_exactly_one_more(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    queued = [send(PER_KEY, "k", f"q{i}") for i in range(20)]
    worker = cluster.worker("w1")
    values = [r.get(timeout=60) for r in queued]
    (first,) = runs_of(journal, PER_KEY)
    assert {v["run"] for v in values} == {first["id"]}  # one run; every caller has its result

    long = send(PER_KEY, "k", "long", 5.0, True)
    wait_for(lambda: started(journal, PER_KEY, "long"), timeout=30, what="the long run")
    during = [send(PER_KEY, "k", f"d{i}") for i in range(10)]
    wait_for(lambda: coalesce_info(cluster, worker.hostname)["coalesced"] == 19 + 9, timeout=30,
             what="d1..d9 covered")  # fmt: skip
    listed = extras(cluster, "coalesce", "--json")
    assert listed.returncode == 0, listed.stderr
    (key,) = json.loads(listed.stdout)
    assert (key["task"], key["key"], key["run"]["id"], key["wait"]["id"], key["covered"]) == (
        PER_KEY, "k", long.id, during[0].id, 9,
    )  # fmt: skip
    text = extras(cluster, "coalesce").stdout
    assert f"running {long.id}, waiting {during[0].id}, 9 covered" in text
    assert "1 coalesced key(s) held (a run or a waiting run), 0 idle" in text
    values = [r.get(timeout=60) for r in during]
    assert long.get(timeout=60)["run"] == long.id
    runs = runs_of(journal, PER_KEY)
    assert len(runs) == 3  # the first, the long one, exactly one more
    long_run, more = runs[1], runs[2]
    assert (long_run["tag"], more["tag"]) == ("long", "d0")  # keep="first": d0's arguments
    assert more["start"] >= long_run["t"]  # started after the long run ended
    assert {v["run"] for v in values} == {more["id"]}
    info = coalesce_info(cluster, worker.hostname)
    assert (info["coalesced"], info["runs"], info["waited"]) == (19 + 9, 3, 1)
    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=3).stats()
    totals = stats[worker.hostname]["extras"]["tasks"][PER_KEY]["total"]
    # a covered message ends as if it had run: it counts as succeeded too
    assert (totals["received"], totals["coalesced"], totals["succeeded"]) == (31, 28, 31)
    # the key idle now (its last run kept for late messages): not counted as held
    wait_for(lambda: "0 coalesced key(s) held (a run or a waiting run), 1 idle"
             in extras(cluster, "coalesce").stdout, timeout=30, what="the key idle")  # fmt: skip


def test_revoking_the_waiting_run_revokes_what_it_covers_and_a_covered_id_is_too_late(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    worker = cluster.worker("w1")
    long = send(PER_KEY, "k", "long", 3.0, True)
    wait_for(lambda: started(journal, PER_KEY, "long"), timeout=30, what="the long run")
    waiting = send(PER_KEY, "k", "waiting")
    covered = [send(PER_KEY, "k", f"c{i}") for i in range(3)]
    wait_for(lambda: coalesce_info(cluster, worker.hostname)["coalesced"] == 3, timeout=30,
             what="c0..c2 covered")  # fmt: skip
    cluster.app.control.revoke(waiting.id)
    long.get(timeout=30)
    wait_for(lambda: all(r.state == "REVOKED" for r in [waiting, *covered]), timeout=30,
             what="the waiting run and what it covers revoked")  # fmt: skip
    assert [e["tag"] for e in runs_of(journal, PER_KEY)] == ["long"]
    # a covered message revoked: it resolves revoked; the run it joined still happens
    again = send(PER_KEY, "k", "again", 2.0, True)
    wait_for(lambda: started(journal, PER_KEY, "again"), timeout=30, what="the next run")
    follower = send(PER_KEY, "k", "follower")
    late = send(PER_KEY, "k", "late")
    wait_for(lambda: coalesce_info(cluster, worker.hostname)["coalesced"] == 4, timeout=30,
             what="late covered")  # fmt: skip
    cluster.app.control.revoke(late.id)
    assert follower.get(timeout=30)["run"] == follower.id
    assert again.get(timeout=30)["run"] == again.id
    wait_for(lambda: late.state == "REVOKED", timeout=30, what="late revoked")


def test_a_message_with_an_eta_counts_as_sent_at_its_eta(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """Sent before the long run started, but due 2 s later: that run does not do its work;
    it waits, then runs after the long run."""
    cluster.configure(include=INCLUDE)
    cluster.worker("w1")
    later = send(PER_KEY, "k", "later", 0.05, True, countdown=2)
    long = send(PER_KEY, "k", "long", 4.0, True)
    assert long.get(timeout=60)["run"] == long.id
    assert later.get(timeout=60)["run"] == later.id
    runs = runs_of(journal, PER_KEY)
    assert [e["tag"] for e in runs] == ["long", "later"] and runs[1]["start"] >= runs[0]["t"]


def test_keep_last_runs_the_newest_arguments(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    cluster.worker("w1")
    name = "tests.coalesce.last"
    long = send(name, "k", "long", 2.0, True)
    wait_for(lambda: started(journal, name, "long"), timeout=30, what="the long run")
    during = [send(name, "k", f"d{i}") for i in range(5)]
    values = [r.get(timeout=60) for r in during]
    long.get(timeout=30)
    runs = runs_of(journal, name)
    assert [e["tag"] for e in runs] == ["long", "d4"]
    assert {v["tag"] for v in values} == {"d4"}


def test_a_retry_keeps_the_key_for_the_whole_chain(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """A run that retries (twice, 1 s apart) is one run: a message sent during it waits for
    the last attempt, then runs once."""
    name = "tests.coalesce.retrying"
    cluster.configure(include=INCLUDE)
    cluster.worker("w1")
    first = send(name, "k", "first")
    wait_for(lambda: started(journal, name, "first"), timeout=30, what="the first attempt")
    during = send(name, "k", "during")
    assert first.get(timeout=60)["tag"] == "first"
    assert during.get(timeout=60)["tag"] == "during"
    runs = runs_of(journal, name)
    assert [(e["tag"], e["retries"]) for e in runs] == [
        ("first", 0), ("first", 1), ("first", 2), ("during", 0), ("during", 1), ("during", 2)
    ]  # fmt: skip
    assert runs[3]["start"] >= runs[2]["t"]  # after the whole chain of the first


def test_a_long_wait_is_parked_and_starts_when_the_run_ends(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """A waiting run held longer than extras_limit_max_hold is parked in the delay store
    (the prefetch window is not taken); the run's end makes it due at once."""
    cluster.configure(include=INCLUDE, extras_limit_max_hold=0.5)
    worker = cluster.worker("w1")
    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=3).stats()
    assert "coalesce() on tests.coalesce.per_key" in stats[worker.hostname]["extras_delay"]["uses"]
    long = send(PER_KEY, "k", "long", 6.0, True)
    wait_for(lambda: started(journal, PER_KEY, "long"), timeout=30, what="the long run")
    waiting = send(PER_KEY, "k", "waiting", 0.05, True)
    wait_for(lambda: coalesce_info(cluster, worker.hostname).get("parked") == 1, timeout=30,
             what="the waiting run parked")  # fmt: skip
    covered = [send(PER_KEY, "k", f"c{i}") for i in range(3)]
    holds = RedisHolds(redis_client(cluster.app), store_key(cluster.app))
    (key,) = list(holds.listing())
    assert (key["wait"]["id"], key["wait"]["h"], bool(key["wait"]["e"])) == (waiting.id, "", True)
    assert {r.get(timeout=60)["run"] for r in covered} == {waiting.id}
    long.get(timeout=30)
    runs = runs_of(journal, PER_KEY)
    assert [e["tag"] for e in runs] == ["long", "waiting"]
    gap = runs[1]["start"] - runs[0]["t"]
    print(f"\nthe parked waiting run started {gap:.2f} s after the run ended (lease 30 s)")
    assert 0 <= gap < 10.0  # made due by the run's end, not by its lease (30 s)


def test_covered_messages_take_no_token_and_a_parked_run_keeps_its_key(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """coalesce() before limit("2/s"): 6 keys x 5 messages queued run 6 times, the covered
    24 take no token; runs waiting longer than extras_limit_max_hold are parked by the
    limit and keep their key meanwhile."""
    name = "tests.coalesce.limited"
    cluster.configure(include=INCLUDE, extras_limit_max_hold=0.2)
    results = [send(name, f"k{i % 6}", i) for i in range(30)]
    worker = cluster.worker("w1")
    values = [r.get(timeout=60) for r in results]
    runs = runs_of(journal, name)
    assert sorted(e["key"] for e in runs) == [f"k{i}" for i in range(6)]
    assert all(v["run"] in {e["id"] for e in runs if e["key"] == v["key"]} for v in values)
    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=3).stats()
    totals = stats[worker.hostname]["extras"]["tasks"][name]["total"]
    assert totals["coalesced"] == 24
    assert totals["rate_limited"] <= 6 and totals["parked"] >= 1


def test_three_workers_two_thousand_messages_over_fifty_keys(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """Never two runs of a key at once; every message followed by a run of its key that
    started after it was sent; no more runs than messages; every result resolves."""
    cluster.configure(include=INCLUDE)
    for name in ("w1", "w2", "w3"):
        cluster.worker(name, start=False).start(wait=False)
    for worker in cluster.workers:
        worker.wait_ready()
    rng = random.Random(24)
    messages: list[tuple[str, float, AsyncResult]] = []
    for i in range(2000):
        key = f"k{rng.randrange(50)}"
        sent = time.time()
        result = send(PER_KEY, key, i, rng.uniform(0.0, 0.04), headers={SENT_HEADER: sent})
        messages.append((key, sent, result))
        if rng.random() < 0.05:
            time.sleep(rng.uniform(0.0, 0.2))  # bursts and lulls
    pending = [r for _, _, r in messages]
    deadline = time.monotonic() + 180
    while pending and time.monotonic() < deadline:
        pending = [r for r in pending if not r.ready()]
        time.sleep(0.5)
    assert not pending, f"{len(pending)} results never resolved"
    runs = runs_of(journal, PER_KEY)
    by_key: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_key.setdefault(run["key"], []).append(run)
    assert sum(overlaps(r) for r in by_key.values()) == 0
    lost = [(k, s) for k, s, _ in messages if not any(r["start"] > s for r in by_key.get(k, []))]
    assert lost == []
    run_ids = {r["id"] for r in runs}
    assert {r.result["run"] for _, _, r in messages} <= run_ids  # each result is a run's
    assert len(runs) <= len(messages)
    print(f"\n2,000 messages over 50 keys on 3 workers: {len(runs)} runs "
          f"({len(runs) / 2000:.1%} of the messages), {len(by_key)} keys")  # fmt: skip


def test_sigkill_of_the_worker_running_a_key_frees_it_within_its_lease(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """The worker running a key (lease 3 s) is SIGKILLed, three times: the waiting run on
    another worker starts within lease + 1 s, and every caller, the killed run's too,
    resolves with its result; nothing is left held."""
    side = f"{cluster.ns}-side"
    cluster.configure(include=INCLUDE)
    waiter = cluster.worker("waiter", queues=(side,))
    for round_ in range(3):
        runner = cluster.worker(f"runner{round_}", concurrency=1)
        killed = send(CRASHY, "k", f"killed{round_}", 60.0, True)
        wait_for(lambda r=round_: started(journal, CRASHY, f"killed{r}"), timeout=30,
                 what="the run to be killed")  # fmt: skip
        waiting = send(CRASHY, "k", f"waiting{round_}", 0.05, True, queue=side)
        covered = [send(CRASHY, "k", f"c{round_}.{i}", queue=side) for i in range(3)]
        expected = 3 * (round_ + 1)
        wait_for(lambda n=expected: coalesce_info(cluster, waiter.hostname).get("coalesced") == n,
                 timeout=30, what="the waiting run and its covered messages")  # fmt: skip
        runner.kill()
        killed_at = time.time()
        entry = wait_for(lambda r=round_: started(journal, CRASHY, f"waiting{r}"), timeout=30,
                         what="the waiting run")  # fmt: skip
        print(f"\nround {round_}: the waiting run started {entry['start'] - killed_at:.2f} s "
              "after the SIGKILL (lease 3 s)")  # fmt: skip
        assert entry["start"] - killed_at <= 3.0 + 1.0
        run_id = waiting.get(timeout=30)["run"]
        assert run_id == waiting.id
        assert killed.get(timeout=30)["run"] == run_id  # the killed run's caller too
        assert {r.get(timeout=30)["run"] for r in covered} == {run_id}
    holds = RedisHolds(redis_client(cluster.app), store_key(cluster.app))
    wait_for(lambda: all(k["run"] is None and k["wait"] is None for k in holds.listing()),
             timeout=10, what="nothing held")  # fmt: skip


@pytest.mark.parametrize("on_store_error", ["hold", "run"])
def test_a_store_restart_mid_run(
    cluster: Cluster, send: Callable[..., Any], journal: Journal, tmp_path: Path,
    on_store_error: str,
) -> None:  # fmt: skip
    """The store (a private Redis, appendonly) restarts while a key runs and messages of
    the key arrive: nothing is lost; with ``'hold'`` never two runs at once, with ``'run'``
    the messages of the outage run at once."""
    (tmp_path / "store").mkdir()
    store = PrivateRedis(tmp_path / "store").start()
    try:
        cluster.configure(include=INCLUDE, extras_redis_url=store.url,
                          extras_coalesce_on_store_error=on_store_error,
                          extras_limit_store_retry=0.5)  # fmt: skip
        worker = cluster.worker("w1", concurrency=4)
        long = send(PER_KEY, "k", "long", 4.0, True)
        wait_for(lambda: started(journal, PER_KEY, "long"), timeout=30, what="the long run")
        store.stop()
        during = [send(PER_KEY, "k", f"d{i}") for i in range(5)]
        if on_store_error == "run":
            wait_for(lambda: len(runs_of(journal, PER_KEY)) >= 5, timeout=30,
                     what="the outage's messages to run")  # fmt: skip
        else:
            time.sleep(1.5)  # the outage lasts a while: nothing of the key may start
        store.start()
        values = [r.get(timeout=60) for r in during]
        long.get(timeout=60)
        runs = runs_of(journal, PER_KEY)
        assert {v["run"] for v in values} <= {r["id"] for r in runs}
        if on_store_error == "hold":
            assert overlaps(runs) == 0
            assert len(runs) == 2  # the long run, then one for the five sent meanwhile
        else:
            assert len(runs) == 6  # each message of the outage ran, beside the long one
        assert store_outages(worker.log(), "coalescing holds")
    finally:
        store.stop()


# -- covered messages end as if they had run: callbacks, chains, chords ------------------------

CANVAS = (tests.support.tasks_canvas.__name__,)
CO, CO_FAIL, RECORD = "tests.canvas.co", "tests.canvas.co_fail", "tests.canvas.record"


def _two_workers(cluster: Cluster) -> None:
    """Two prefork workers of 2 processes, started together: a run may end on the other
    worker than the one that received (and acked) the messages it covered."""
    for name in ("w1", "w2"):
        cluster.worker(name, start=False).start(wait=False)
    for worker in cluster.workers:
        worker.wait_ready()


def _runs(journal: Journal, task: str) -> list[dict[str, Any]]:
    return [e for e in journal.entries() if e["task"] == task and e.get("phase") == "run"]


def _totals(cluster: Cluster, task: str) -> dict[str, int]:
    """The stats counters of *task*, summed over the cluster's workers."""
    stats = cluster.app.control.inspect(timeout=3).stats() or {}
    summed: dict[str, int] = {}
    for reply in stats.values():
        for counter, n in reply["extras"]["tasks"].get(task, {}).get("total", {}).items():
            summed[counter] = summed.get(counter, 0) + n
    return summed


def _frozen(app: Celery, tag: str) -> Any:
    """``record.si(tag)`` with its id fixed now, to read its result once it ran."""
    sig = app.tasks[RECORD].si(tag)
    sig.freeze()
    return sig


def test_six_chains_on_one_key_all_continue(cluster: Cluster, journal: Journal) -> None:
    """``chain(co.si("c", i), record.si(100 + i))`` x 6, queued before the workers start: one
    run covers the five others, and each of the six chains goes on to its second step."""
    app = cluster.configure(include=CANVAS)
    co, record = app.tasks[CO], app.tasks[RECORD]
    results = [chain(co.si("c", i), record.si(100 + i)).apply_async() for i in range(6)]
    _two_workers(cluster)
    assert sorted(r.get(timeout=60) for r in results) == [100, 101, 102, 103, 104, 105]
    (run,) = _runs(journal, CO)
    assert {r.parent.get(timeout=10) for r in results} == {run["tag"]}
    counted = wait_for(lambda: (t := _totals(cluster, CO)).get("succeeded") == 6 and t,
                       timeout=30, what="the six counted as succeeded")  # fmt: skip
    assert (counted["received"], counted["started"], counted["coalesced"]) == (6, 1, 5)


def test_six_links_on_one_key_all_run(cluster: Cluster, journal: Journal) -> None:
    """``co.apply_async(("L", i), link=record.si(f"L{i}"))`` x 6: the six callbacks run."""
    app = cluster.configure(include=CANVAS)
    links = [_frozen(app, f"L{i}") for i in range(6)]
    sent = [app.tasks[CO].apply_async(("L", i), link=links[i]) for i in range(6)]
    _two_workers(cluster)
    assert [AsyncResult(s.id, app=app).get(timeout=60) for s in links] == [
        f"L{i}" for i in range(6)
    ]
    (run,) = _runs(journal, CO)
    assert [r.get(timeout=10) for r in sent] == [run["tag"]] * 6
    assert len([e for e in journal.entries() if e["task"] == RECORD]) == 6


def test_a_chord_over_two_coalesced_keys_counts_every_part(
    cluster: Cluster, journal: Journal
) -> None:
    """``chord(co.s(f"h{i % 2}", i) for i in range(10))(total.s())``: two runs cover the
    eight other parts; the chord fires once, with ten results, each its covering run's."""
    app = cluster.configure(include=CANVAS)
    co, total = app.tasks[CO], app.tasks["tests.canvas.total"]
    result = chord(co.s(f"h{i % 2}", i) for i in range(10))(total.s())
    _two_workers(cluster)
    values = result.get(timeout=60)
    runs = {e["key"]: e["tag"] for e in _runs(journal, CO)}
    assert sorted(runs) == ["h0", "h1"]
    assert values == sorted([runs["h0"]] * 5 + [runs["h1"]] * 5)


def test_a_failing_run_fails_what_it_covered_errbacks_and_chains(
    cluster: Cluster, journal: Journal
) -> None:
    """The covering run raises: each covered message fails with its exception, its
    ``link_error`` errback runs, and the rest of its chain fails too."""
    app = cluster.configure(include=CANVAS)
    co_fail, record = app.tasks[CO_FAIL], app.tasks[RECORD]
    errbacks = [_frozen(app, f"E{i}") for i in range(6)]
    failing = [co_fail.apply_async(("E", i), link_error=errbacks[i]) for i in range(6)]
    chains = [chain(co_fail.si("F", i), record.si(i)).apply_async() for i in range(3)]
    _two_workers(cluster)
    assert [AsyncResult(s.id, app=app).get(timeout=60) for s in errbacks] == [
        f"E{i}" for i in range(6)
    ]
    runs = {e["key"]: e["tag"] for e in _runs(journal, CO_FAIL)}
    assert sorted(runs) == ["E", "F"]
    for r in failing:
        r.get(timeout=30, propagate=False)
        assert (r.state, str(r.result)) == ("FAILURE", f"run {runs['E']} failed")
    for r in chains:
        r.get(timeout=30, propagate=False)
        assert (r.state, str(r.result)) == ("FAILURE", f"run {runs['F']} failed")
    callbacks = [e["tag"] for e in journal.entries() if e["task"] == RECORD]
    assert sorted(callbacks) == sorted(f"E{i}" for i in range(6))  # no chain went on


def test_a_message_covered_by_a_run_that_ended_ends_where_it_arrives(
    cluster: Cluster, journal: Journal
) -> None:
    """A backlog: sent before a run started, delivered after it ended. The worker that
    receives it ends it (its callback runs, with the run's result), then acks it."""
    app = cluster.configure(include=CANVAS)
    co = app.tasks[CO]
    cluster.worker("w1")
    before = time.time()
    assert co.delay("X", "first").get(timeout=60) == "first"
    links = [_frozen(app, f"X{i}") for i in range(3)]
    late = [co.apply_async(("X", i), link=links[i], headers={SENT_HEADER: before})
            for i in range(3)]  # fmt: skip
    assert [AsyncResult(s.id, app=app).get(timeout=60) for s in links] == ["X0", "X1", "X2"]
    assert [r.get(timeout=10) for r in late] == ["first"] * 3
    assert [e["tag"] for e in _runs(journal, CO)] == ["first"]


def test_messages_covered_on_a_worker_that_died_end_when_the_run_ends_elsewhere(
    cluster: Cluster, journal: Journal
) -> None:
    """The worker that received and acked the covered messages is SIGKILLed before the
    run covering them (on another worker) ends: their endings were in the store with their
    ids, so the run's worker ends them (callbacks run, results are the run's)."""
    app = cluster.configure(include=CANVAS)
    co, side = app.tasks[CO], f"{cluster.ns}-side"
    cluster.worker("runner")
    acker = cluster.worker("acker", queues=(side,))
    before = time.time()
    long = co.apply_async(("K", "long", 3.0))
    wait_for(lambda: _runs(journal, CO), timeout=30, what="the long run")
    links = [_frozen(app, f"K{i}") for i in range(4)]
    covered = [co.apply_async(("K", i), link=links[i], headers={SENT_HEADER: before}, queue=side)
               for i in range(4)]  # fmt: skip
    wait_for(lambda: coalesce_info(cluster, acker.hostname).get("coalesced") == 4, timeout=30,
             what="the four covered (and acked) on the acker")  # fmt: skip
    acker.kill()
    assert long.get(timeout=60) == "long"
    assert [AsyncResult(s.id, app=app).get(timeout=60) for s in links] == [
        f"K{i}" for i in range(4)
    ]
    assert [r.get(timeout=10) for r in covered] == ["long"] * 4
    assert [e["tag"] for e in _runs(journal, CO)] == ["long"]


def test_what_a_replaced_run_covered_ends_with_its_replacement(
    cluster: Cluster, journal: Journal
) -> None:
    """A covering run that calls ``self.replace`` has its result only when its replacement
    ends (7 s here): what it covered ends then, with that result (issue 56: the endings gave
    up after 5 s and left them pending)."""
    app = cluster.configure(include=INCLUDE)
    results = [app.send_task("tests.coalesce.replacing", ("r", i)) for i in range(5)]
    cluster.worker("w1")
    values = [r.get(timeout=60) for r in results]
    (run,) = [e for e in journal.entries() if e["task"] == "tests.coalesce.replacing"]
    assert values == [f"replaced {run['tag']}"] * 5


def test_what_a_rejected_run_covered_ends_as_celery_ends_the_rejected_task(
    cluster: Cluster, journal: Journal
) -> None:
    """A covering run that raises ``Reject``: what it covered ends as Celery ends the
    rejected task itself: FAILURE on Celery 5.7, which stores it; before, no state (the
    rejected task's own stays PENDING too)."""
    app = cluster.configure(include=INCLUDE)
    results = [app.send_task("tests.coalesce.rejecting", ("r", i)) for i in range(5)]
    cluster.worker("w1")
    wait_for(lambda: any(e["task"] == "tests.coalesce.rejecting" for e in journal.entries()),
             timeout=60, what="the run")  # fmt: skip
    if celery.VERSION >= (5, 7):
        wait_for(lambda: {r.state for r in results} == {"FAILURE"}, timeout=30,
                 what=lambda: f"all FAILURE, not {[r.state for r in results]}")  # fmt: skip
    else:
        time.sleep(6.0)  # past the covered endings' first attempts
        assert {r.state for r in results} == {"PENDING"}
    runs = [e for e in journal.entries() if e["task"] == "tests.coalesce.rejecting"]
    assert len(runs) == 1, runs
