"""The endings a coalescing run owes what it covered survive what cuts its worker off between
the run's ``finish`` and the endings (issue 56): a finish the store did but never answered
(a stalled path that forwards it later, chaos seed 445531), and a worker SIGKILLed there.

Real ``celery worker`` subprocesses on the Redis broker; the store is a private Redis
(behind a proxy that can stop forwarding, for the stall); every run journals its end and
returns its own id, so "each covered message ends with its covering run's result" and "no
body runs twice" are read from the results and the journal.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

# imported here: this process is the producer, and stamps the send time of coalesced tasks
import tests.support.tasks_canvas
import tests.support.tasks_coalesce
from celery_extras.admission.covered import PAUSE_ACK_ENV
from celery_extras.admission.sent import SENT_HEADER
from celery_extras.keyed.endings import PAUSE_ENV
from tests.integration.conftest import Cluster, restartable_cluster
from tests.support import proj
from tests.support.brokers import REDIS_URL, PrivateRedis
from tests.support.journal import Journal
from tests.support.outages import store_outages
from tests.support.proxy import StallingProxy
from tests.support.workers import WorkerProcess, wait_for

INCLUDE = ("tests.support.tasks_coalesce",)
PER_KEY = "tests.coalesce.per_key"
#: Seconds the store's path stays stalled past the covering run's end: 3 of the worker's
#: ``extras_store_retry`` (1 s), so its finish is written to the stalled path and times out.
STALL = 3.0


def coalesce_info(cluster: Cluster, hostname: str) -> dict[str, Any]:
    """*hostname*'s coalescing figures in ``inspect stats`` (empty if it did not answer)."""
    policies = cluster.stats(hostname).get("extras_policies", {})
    return dict(policies.get("coalesce", {}))


def ended(journal: Journal, tag: str) -> dict[str, Any]:
    """The journal's end entry of the run tagged *tag* (empty until it ends)."""
    for entry in journal.entries():
        if entry["task"] == PER_KEY and entry.get("phase") == "end" and entry.get("tag") == tag:
            return entry
    return {}


def started(journal: Journal, tag: str) -> bool:
    """Whether the run tagged *tag* started."""
    return any(e.get("tag") == tag and e.get("phase") == "start" for e in journal.entries())


def bodies(journal: Journal) -> Counter[str]:
    """How many times each tag's body ended."""
    return Counter(e["tag"] for e in journal.entries()
                   if e["task"] == PER_KEY and e.get("phase") == "end")  # fmt: skip


def cover_three(cluster: Cluster, send: Callable[..., Any], journal: Journal,
                hostname: str, seconds: float) -> tuple[Any, list[Any]]:  # fmt: skip
    """A run of key ``k`` lasting *seconds*, started, and three messages it covers (sent
    while it waited for the key's run before it, ``block``: sent before it started)."""
    send(PER_KEY, "k", "block", 1.0, True)
    wait_for(lambda: started(journal, "block"), timeout=60, what="the block run started")
    long = send(PER_KEY, "k", "long", seconds, True)
    covered = [send(PER_KEY, "k", f"c{i}") for i in range(3)]
    wait_for(lambda: coalesce_info(cluster, hostname).get("coalesced") == 3, timeout=60,
             what="c0..c2 covered by the long run")  # fmt: skip
    wait_for(lambda: started(journal, "long"), timeout=60, what="the long run started")
    return long, covered


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_finish_the_store_did_but_never_answered_ends_what_it_covered_seed_445531(
    cluster: Cluster, send: Callable[..., Any], journal: Journal, tmp_path: Path
) -> None:
    """The store's path stalls as a covering run ends (eventlet, as seed 445531): its finish
    times out, and reaches the store when the path comes back, which takes the covered ids
    out of the key. The worker asks the finish again until the store answers; the store
    answers with the endings the run still owes, so the three covered messages end with the
    run's result, once. (Before: the worker gave up on the finish, and the covered messages
    stayed PENDING for good.)"""
    (tmp_path / "store").mkdir()
    store = PrivateRedis(tmp_path / "store").start()
    proxy = StallingProxy(("127.0.0.1", store.port)).start()
    try:
        cluster.configure(include=INCLUDE, extras_redis_url=proxy.url)
        worker = cluster.worker("w1", concurrency=4, pool="eventlet")
        assert send(PER_KEY, "warm", "warm").get(timeout=60)["tag"] == "warm"
        long, covered = cover_three(cluster, send, journal, worker.hostname, 3.0)

        proxy.stall()  # the run ends during the stall: its finish is written, then times out
        wait_for(lambda: ended(journal, "long"), timeout=60, what="the long run's end")
        wait_for(lambda: store_outages(worker.log()), timeout=60, what="a store call timed out")
        ends = time.monotonic()  # the stall lasts STALL s past the run's end (a fault's length,
        wait_for(lambda: time.monotonic() - ends > STALL, timeout=60)  # not a condition's wait)
        proxy.resume()  # the stalled finish reaches the store now

        values = [r.get(timeout=120) for r in covered]
        assert [v["run"] for v in values] == [long.id] * 3
        assert [r.state for r in covered] == ["SUCCESS"] * 3
        assert bodies(journal) == {"warm": 1, "block": 1, "long": 1}
        info = coalesce_info(cluster, worker.hostname)
        assert (info["owed_finish_again"], info["covered_ended"]) == (1, 3)
    finally:
        proxy.close()
        store.stop()


def owed_keys(store: PrivateRedis, ns: str) -> int:
    """How many keys the store notes as owing endings."""
    client = redis.Redis(port=store.port)
    try:
        return int(client.zcard(f"{ns}:coalesce:owed"))
    finally:
        client.close()


def start_paused_worker(cluster: Cluster, name: str, pause: float,
                        where: str = PAUSE_ENV) -> WorkerProcess:  # fmt: skip
    """A worker of the cluster that waits *pause* s between a run's finish and its covered
    messages' endings (the test-only :data:`~celery_extras.keyed.endings.PAUSE_ENV`), or
    *where* another test-only pause says."""
    env = proj.worker_env(cluster.broker, cluster.ns, cluster.conf, cluster.include)
    env[where] = str(pause)
    worker = WorkerProcess(name, env, cluster.logdir / f"{name}.log", concurrency=2)
    cluster.workers.append(worker)
    return worker.start()


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_worker_killed_between_finish_and_endings_has_them_ended_by_another(
    cluster: Cluster, send: Callable[..., Any], journal: Journal, tmp_path: Path
) -> None:
    """The worker that ran a covering run is SIGKILLed after its finish and before the
    covered messages' endings (a test-only pause holds it there). The store kept them owed;
    once the dead finisher's claim runs out (30 s), another worker's sweep ends them with
    the run's stored result, once. (Before: the finish took them out of the store, and the
    three covered messages stayed PENDING for good.)"""
    (tmp_path / "store").mkdir()
    store = PrivateRedis(tmp_path / "store").start()
    try:
        cluster.configure(include=INCLUDE, extras_redis_url=store.url)
        doomed = start_paused_worker(cluster, "w1", 600.0)
        assert send(PER_KEY, "warm", "warm").get(timeout=60)["tag"] == "warm"
        long, covered = cover_three(cluster, send, journal, doomed.hostname, 1.0)
        assert long.get(timeout=60)["run"] == long.id  # finished: the endings are paused
        wait_for(lambda: owed_keys(store, cluster.ns) == 1, timeout=30,
                 what="the key noted as owing endings")  # fmt: skip
        doomed.kill()
        killed = time.monotonic()
        assert [r.state for r in covered] == ["PENDING"] * 3

        survivor = cluster.worker("w2")
        values = [r.get(timeout=120) for r in covered]
        assert [v["run"] for v in values] == [long.id] * 3
        assert time.monotonic() - killed >= 15.0  # the dead finisher's claim ran out first
        assert bodies(journal) == {"warm": 1, "block": 1, "long": 1}
        info = coalesce_info(cluster, survivor.hostname)
        assert (info["owed_swept"], info["covered_ended"]) == (3, 3)
        wait_for(lambda: owed_keys(store, cluster.ns) == 0, timeout=30,
                 what="the key owing nothing any more")  # fmt: skip
    finally:
        store.stop()


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_finish_answered_only_as_its_worker_stops_is_swept_by_another_seed_878676(
    cluster: Cluster, send: Callable[..., Any], journal: Journal, tmp_path: Path
) -> None:
    """Chaos seed 878676: the store's path stalls as a covering run ends, so its finish times
    out, and reaches the store when the path comes back: what the run covered is owed,
    claimed by its worker, and noted nowhere a sweep looks (the worker notes it once the
    finish answers). The worker is stopped warmly before its back-off from the store lets it
    ask the finish again. Stopping, it asks once more, whatever its back-off, notes the key
    and ends the three covered messages with the run's result (should it stop first, a
    survivor's sweep ends them once its claim runs out). (Before: they stayed PENDING for
    good.)"""
    (tmp_path / "store").mkdir()
    store = PrivateRedis(tmp_path / "store").start()
    proxy = StallingProxy(("127.0.0.1", store.port)).start()
    try:  # a back-off from the store far longer than the test: only the stop asks again
        cluster.configure(include=INCLUDE, extras_redis_url=proxy.url, extras_store_retry=600.0)
        worker = cluster.worker("w1", concurrency=4)
        assert send(PER_KEY, "warm", "warm").get(timeout=60)["tag"] == "warm"
        long, covered = cover_three(cluster, send, journal, worker.hostname, 2.0)

        proxy.stall()  # the run ends during the stall: its finish is written, then times out
        wait_for(lambda: ended(journal, "long"), timeout=60, what="the long run's end")
        wait_for(lambda: store_outages(worker.log()), timeout=60, what="a store call timed out")
        proxy.resume()  # the stalled finish reaches the store now: owed, noted nowhere
        assert owed_keys(store, cluster.ns) == 0
        worker.stop()  # it ends them as it stops, or a survivor's sweep does after its claim
        cluster.worker("w2")
        values = [r.get(timeout=120) for r in covered]
        assert [v["run"] for v in values] == [long.id] * 3
        assert bodies(journal) == {"warm": 1, "block": 1, "long": 1}
        wait_for(lambda: owed_keys(store, cluster.ns) == 0, timeout=60,
                 what="the key owing nothing any more")  # fmt: skip
    finally:
        proxy.close()
        store.stop()


CANVAS = (tests.support.tasks_canvas.__name__,)
CO, RECORD = "tests.canvas.co", "tests.canvas.record"


def test_a_covered_message_ended_as_the_connection_drops_sees_its_callback_once(
    ns: str, tmp_path: Path, journal: Journal
) -> None:
    """A message covered by a run that ended (sent before it started, delivered after it
    ended) ends where it arrives, then is acked; the broker restarts between its ending and
    its ack (a test-only pause holds it there), so the broker delivers it again. Its second
    delivery is acked without a second ending: its callback ran once. (Before: it was ended
    again, and its callback ran twice.)"""
    with restartable_cluster("redis", ns, tmp_path) as (cluster, broker):
        app = cluster.configure(
            include=CANVAS,
            extras_redis_url=REDIS_URL,  # the store stays up: the broker alone restarts
            broker_transport_options={"visibility_timeout": 5, "unacked_restore_interval": 1},
        )
        worker = start_paused_worker(cluster, "w1", 4.0, where=PAUSE_ACK_ENV)
        before = time.time()
        assert app.tasks[CO].delay("X", "first").get(timeout=60) == "first"
        link = app.tasks[RECORD].si("X0")
        link.freeze()
        late = app.tasks[CO].apply_async(("X", 0), link=link, headers={SENT_HEADER: before})

        def callbacks() -> list[Any]:
            return [e["tag"] for e in journal.entries() if e["task"] == RECORD]

        wait_for(lambda: callbacks() == ["X0"], timeout=60, what="the callback, once")
        broker.restart()  # within the 4 s between the ending and the ack
        wait_for(lambda: worker.log().count("Connected to") >= 2, timeout=90,
                 what="the worker to reconnect")  # fmt: skip
        wait_for(lambda: coalesce_info(cluster, worker.hostname).get("coalesced") == 2,
                 timeout=90, interval=0.5,
                 what="the message delivered again, and covered")  # fmt: skip
        assert late.get(timeout=30) == "first"
        info = coalesce_info(cluster, worker.hostname)
        assert (info["covered_ended"], callbacks()) == (1, ["X0"])
        runs = [e["tag"] for e in journal.entries() if e["task"] == CO and e.get("phase") == "run"]
        assert runs == ["first"]


def test_a_covering_run_dropped_before_it_ran_runs_when_delivered_again(
    ns: str, tmp_path: Path, journal: Journal
) -> None:
    """``-c 1``: key ``k``'s run ``first`` runs, ``other`` (another key) waits for the pool
    process, and ``run`` waits for ``first`` covering c0..c2. ``first`` ends: ``other`` takes
    the process and ``run``, resumed, waits for it in Celery's semaphore. The broker
    restarts: Celery drops ``run`` from the semaphore (its message unacked, delivered
    again). ``run`` runs once then, and what it covered ends with its result. (Before: the
    pipeline heard the dropped run as one that ended unseen, and what it covered failed.)"""
    with restartable_cluster("redis", ns, tmp_path) as (cluster, broker):
        app = cluster.configure(
            include=INCLUDE,
            extras_redis_url=REDIS_URL,  # the store stays up: the broker alone restarts
            broker_transport_options={"visibility_timeout": 5, "unacked_restore_interval": 1},
        )
        worker = cluster.worker("w1", concurrency=1)
        task = app.tasks[PER_KEY]
        task.delay("k", "first", 1.5, True)
        wait_for(lambda: started(journal, "first"), timeout=60, what="the first run started")
        task.delay("other", "other", 6.0, True)
        run = task.delay("k", "run", 0.2, True)
        covered = [task.delay("k", f"c{i}") for i in range(3)]
        wait_for(lambda: coalesce_info(cluster, worker.hostname).get("coalesced") == 3,
                 timeout=60, what="c0..c2 covered by the waiting run")  # fmt: skip
        wait_for(lambda: started(journal, "other"), timeout=60, what="other took the process")
        assert not started(journal, "run")  # resumed, waiting in Celery's semaphore
        broker.restart()
        wait_for(lambda: worker.log().count("Connected to") >= 2, timeout=90,
                 what="the worker to reconnect")  # fmt: skip
        result = run.get(timeout=90)
        assert (result["tag"], result["run"]) == ("run", run.id)
        assert [c.get(timeout=60) for c in covered] == [result] * 3
        assert bodies(journal)["run"] == 1
        assert "ended unseen" not in worker.log()
