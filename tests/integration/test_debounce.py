"""Debounce on two real prefork workers, on Redis and on RabbitMQ (store: Redis).

Every run journals its start and end (written by the pool processes on the one host
clock) and returns its own id and tag, so "one run per burst, with its last message",
"never before ``wait`` of quiet", "at least every ``max_wait``", "one run of a key at a
time" and "every caller's result is its covering run's" are checked from the stamps and
the results. ``save`` debounces with ``wait`` 0.5 s, ``max_wait`` 2 s and a 3 s lease.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from celery import chain, chord
from celery.result import AsyncResult

# imported here too: the canvas test builds its signatures from this process' app
import tests.support.tasks_canvas
import tests.support.tasks_debounce
from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.support.tasks_debounce import LEASE, MAX_WAIT, WAIT
from tests.support.workers import WorkerProcess, wait_for

INCLUDE = (tests.support.tasks_debounce.__name__,)
#: With the canvas tasks (some limited): the app's workers release parked tasks, so a
#: message waiting longer than ``extras_delay_max_hold`` (2 s) is parked.
CANVAS = (*INCLUDE, tests.support.tasks_canvas.__name__)
SAVE, RECORD = "tests.debounce.save", "tests.canvas.record"
#: What a run may take beyond its due time on a loaded two-core machine (a worker asks
#: at its due time; the pool process starts the task; the journal is written).
SLACK = 1.0


def runs_of(journal: Journal) -> list[dict[str, Any]]:
    """The runs of ``save`` that ended, in the order they ended."""
    return [e for e in journal.entries() if e["task"] == SAVE and e.get("phase") == "end"]


def started(journal: Journal, tag: Any) -> dict[str, Any]:
    for entry in journal.entries():
        if entry["task"] == SAVE and entry.get("phase") == "start" and entry.get("tag") == tag:
            return entry
    return {}


def debounce_info(cluster: Cluster, worker: WorkerProcess) -> dict[str, Any]:
    stats = cluster.app.control.inspect(destination=[worker.hostname], timeout=3).stats() or {}
    info: dict[str, Any] = (
        stats.get(worker.hostname, {}).get("extras_policies", {}).get("debounce", {})
    )
    return info


def totals(cluster: Cluster) -> dict[str, int]:
    """The stats counters of ``save``, summed over the cluster's workers."""
    stats = cluster.app.control.inspect(timeout=3).stats() or {}
    summed: dict[str, int] = {}
    for reply in stats.values():
        for counter, n in reply["extras"]["tasks"].get(SAVE, {}).get("total", {}).items():
            summed[counter] = summed.get(counter, 0) + n
    return summed


def two_workers(cluster: Cluster) -> list[WorkerProcess]:
    """Two prefork workers of 2 processes on the test's queue, started together: a burst's
    messages reach both."""
    for name in ("w1", "w2"):
        cluster.worker(name, start=False).start(wait=False)
    for worker in cluster.workers:
        worker.wait_ready()
    return list(cluster.workers)


def send_spaced(send: Callable[..., Any], key: str, tags: list[Any], gap: float,
                **options: Any) -> list[tuple[float, Any]]:  # fmt: skip
    """Send ``save(key, tag)`` for each of *tags*, *gap* seconds apart: (time just before
    each was sent, its AsyncResult)."""
    sent = []
    begin = time.monotonic()
    for i, tag in enumerate(tags):
        time.sleep(max(0.0, begin + i * gap - time.monotonic()))
        at = time.time()
        sent.append((at, send(SAVE, key, tag, **options)))
    return sent


def test_ten_messages_a_tenth_apart_run_once_with_the_last_after_the_quiet_period(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    two_workers(cluster)
    sent = send_spaced(send, "k", list(range(10)), 0.1)
    values = [r.get(timeout=60) for _, r in sent]
    (run,) = runs_of(journal)
    last_sent, last = sent[-1]
    assert (run["tag"], run["id"]) == (9, last.id)  # the last message's arguments: itself
    assert run["start"] >= last_sent + WAIT  # quiet for wait after the last was sent
    assert run["start"] <= last_sent + WAIT + SLACK
    assert [v["run"] for v in values] == [last.id] * 10  # every caller: that run
    counted = wait_for(lambda: (t := totals(cluster)).get("succeeded") == 10 and t,
                       timeout=30, what="the ten counted as succeeded")  # fmt: skip
    assert (counted["received"], counted["started"], counted["debounced"]) == (10, 1, 9)


def test_a_steady_stream_runs_at_least_every_max_wait(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """A message every 0.2 s for 5 s (``wait`` 0.5 s never passes between two): a run at
    most ``max_wait`` after the first message of its burst, each with its burst's last
    message, one at a time; the stream's end runs ``wait`` after its last message."""
    cluster.configure(include=INCLUDE)
    two_workers(cluster)
    sent = send_spaced(send, "k", list(range(25)), 0.2)
    values = [r.get(timeout=60) for _, r in sent]
    runs = sorted(runs_of(journal), key=lambda e: e["start"])
    by_id = {r["id"]: r for r in runs}
    assert len(runs) == len({v["run"] for v in values})  # each run covers someone: itself
    assert all(b["start"] >= a["t"] for a, b in itertools.pairwise(runs))  # one at a time
    first_sent: dict[str, float] = {}  # run id -> when its burst's first message was sent
    for (at, _), value in zip(sent, values, strict=True):
        assert by_id[value["run"]]["start"] >= at  # each covered by a run that began later
        first_sent.setdefault(value["run"], at)
    for run in runs:
        burst = [v["tag"] for v in values if v["run"] == run["id"]]
        assert run["tag"] == max(burst)  # the last message of its burst
        assert run["start"] <= first_sent[run["id"]] + MAX_WAIT + SLACK
    assert runs[-1]["tag"] == 24 and runs[-1]["start"] >= sent[-1][0] + WAIT
    assert 3 <= len(runs) <= 4  # 5 s of stream: bursts of about 2 s, then its end
    starts = ", ".join(f"+{r['start'] - sent[0][0]:.2f}" for r in runs)
    print(f"\n25 messages over 5 s: runs at {starts} s, tags {[r['tag'] for r in runs]}")


def test_two_keys_are_independent(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """Key a runs long; a burst of key b runs meanwhile, on time; a message of a sent while
    a runs waits for that run to end (parked in the delay store meanwhile: it waits longer
    than ``extras_delay_max_hold``, and the app's workers release parked tasks)."""
    cluster.configure(include=CANVAS)
    workers = two_workers(cluster)
    long = send(SAVE, "a", "long", 3.0, True)
    began = wait_for(lambda: started(journal, "long"), timeout=30, what="the long run of a")
    during = send(SAVE, "a", "during")
    b_sent = send_spaced(send, "b", [f"b{i}" for i in range(5)], 0.1)
    b_values = [r.get(timeout=60) for _, r in b_sent]
    assert during.get(timeout=60)["tag"] == "during"
    assert long.get(timeout=60)["tag"] == "long"
    runs = {r["tag"]: r for r in runs_of(journal)}
    assert sorted(runs) == ["b4", "during", "long"]
    assert [v["run"] for v in b_values] == [b_sent[-1][1].id] * 5
    assert b_sent[-1][0] + WAIT <= runs["b4"]["start"] <= b_sent[-1][0] + WAIT + SLACK
    assert runs["b4"]["start"] < runs["long"]["t"]  # b did not wait for a's run
    assert runs["during"]["start"] >= runs["long"]["t"]  # a's next burst did
    assert began["start"] == runs["long"]["start"]
    assert sum(debounce_info(cluster, w)["parked"] for w in workers) == 1  # "during"


def test_covered_messages_end_by_the_canvas_rule(cluster: Cluster, journal: Journal) -> None:
    """Three messages with a ``link``, three chains and a chord of four, on one key, in one
    burst: one run (the last message sent); every callback runs with its result, every
    chain goes on, the chord fires once with four results, all the run's."""
    app = cluster.configure(include=CANVAS)
    two_workers(cluster)
    save, record = app.tasks[SAVE], app.tasks[RECORD]
    links = [record.si(f"L{i}") for i in range(3)]
    for link in links:
        link.freeze()
    linked = [save.apply_async(("c", f"l{i}"), link=links[i]) for i in range(3)]
    chains = [chain(save.si("c", f"c{i}"), record.si(100 + i)).apply_async() for i in range(3)]
    fired = chord(save.s("c", f"h{i}") for i in range(4))(record.s())
    assert [AsyncResult(s.id, app=app).get(timeout=60) for s in links] == ["L0", "L1", "L2"]
    assert sorted(r.get(timeout=60) for r in chains) == [100, 101, 102]
    parts = fired.get(timeout=60)
    (run,) = runs_of(journal)
    assert run["tag"] == "h3"  # the last message sent
    assert [p["run"] for p in parts] == [run["id"]] * 4
    assert [r.get(timeout=10)["run"] for r in linked] == [run["id"]] * 3
    assert {r.parent.get(timeout=10)["run"] for r in chains} == {run["id"]}
    callbacks = [e for e in journal.entries() if e["task"] == RECORD]
    assert len(callbacks) == 3 + 3 + 1  # the links, the chains' next steps, the chord body


def test_sigkill_of_the_worker_running_a_key_frees_it_after_its_lease(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """The worker running a key (a long run, lease 3 s) is SIGKILLed while the key's next
    message waits on the other worker: that message runs once the lease has run out, and
    the killed run's caller resolves with it too; a later message runs on its own."""
    side = f"{cluster.ns}-side"
    cluster.configure(include=INCLUDE)
    runner = cluster.worker("runner", concurrency=1)
    waiter = cluster.worker("waiter", queues=(side,))
    killed = send(SAVE, "k", "killed", 60.0, True)
    wait_for(lambda: started(journal, "killed"), timeout=30, what="the run to be killed")
    later = send(SAVE, "k", "later", 0.05, True, queue=side)
    wait_for(lambda: debounce_info(cluster, waiter).get("waited") == 1, timeout=30,
             what="the next message waiting on the other worker")  # fmt: skip
    time.sleep(WAIT + 0.2)  # its quiet period has passed: the run holds it
    assert not started(journal, "later")
    runner.kill()
    killed_at = time.time()
    entry = wait_for(lambda: started(journal, "later"), timeout=30, what="the next run")
    print(f"\nthe next run started {entry['start'] - killed_at:.2f} s after the SIGKILL "
          f"(lease {LEASE:g} s)")  # fmt: skip
    assert entry["start"] - killed_at <= LEASE + 1.5
    assert later.get(timeout=30)["run"] == later.id
    assert killed.get(timeout=30)["run"] == later.id  # the killed run's caller too
    again = send(SAVE, "k", "again", queue=side)
    assert again.get(timeout=30)["run"] == again.id
    assert [r["tag"] for r in runs_of(journal)] == ["later", "again"]
    assert AsyncResult(killed.id, app=cluster.app).state == "SUCCESS"


def test_revoking_the_last_message_of_a_burst_revokes_the_burst(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """The burst's run is revoked before it runs: the messages it covered end revoked too;
    a message revoked on its own in a burst ends revoked, and the burst still runs."""
    cluster.configure(include=INCLUDE)
    two_workers(cluster)
    burst = [r for _, r in send_spaced(send, "k", ["a0", "a1", "a2"], 0.05)]
    cluster.app.control.revoke(burst[-1].id)
    wait_for(lambda: all(r.state == "REVOKED" for r in burst), timeout=30,
             what="the burst revoked")  # fmt: skip
    other = [r for _, r in send_spaced(send, "j", ["b0", "b1", "b2"], 0.05)]
    cluster.app.control.revoke(other[0].id)
    assert other[-1].get(timeout=30)["tag"] == "b2"
    wait_for(lambda: other[0].state == "REVOKED", timeout=30, what="b0 revoked")
    assert other[1].get(timeout=30)["run"] == other[-1].id
    assert [r["tag"] for r in runs_of(journal)] == ["b2"]
