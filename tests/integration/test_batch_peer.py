"""celery-batches' own integration tests (``t/integration/test_batches.py``, 14 tests, each
under task protocols 1 and 2), ported to ``batch()`` on one real prefork worker (Redis):
each gives celery-batches' answer, but for the differences :doc:`migrating-from-celery-
batches` documents (the messages are acked after their batch ran, early-acking tasks
too; ``task_success`` is sent once per call). celery-batches skips its timing tests
(``flush_interval``, ``countdown``, ``eta``) on live brokers; here they run, their
timing read from the journal instead of sleeps.

The producer side is a Celery app per protocol on the worker's namespace: the one worker
takes messages of both protocols, as a worker does while its clients upgrade.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, signals, states
from celery.result import AsyncResult

import tests.support.tasks_batch_migrated as migrated
import tests.support.tasks_batch_peer as peer_tasks
from tests.integration.conftest import Cluster
from tests.support import proj
from tests.support.brokers import require_broker
from tests.support.journal import Journal
from tests.support.workers import WorkerProcess

INCLUDE = (peer_tasks.__name__, migrated.__name__)
ADD, CUMADD, ACKS, ACKS_LATE = (f"{peer_tasks.PEER}{n}" for n in ("add", "cumadd", "acks",
                                                                    "acks_late"))  # fmt: skip
#: ``batch(size=2, wait=1.5)`` on every peer task (celery-batches' ``flush_every=2``).
WAIT = 1.5
PROTOCOLS = pytest.mark.parametrize("protocol", [1, 2])


@dataclass
class Peer:
    """The module's worker, a producer app per task protocol, and the journal."""

    cluster: Cluster
    worker: WorkerProcess
    apps: dict[int, Celery]
    journal: Journal

    def task(self, protocol: int, name: str = ADD) -> Any:
        return self.apps[protocol].tasks[name]

    def batches(self, *results: AsyncResult) -> list[dict[str, Any]]:
        """The batches that ran any of *results*' calls, in the order they ran."""
        ids = {r.id for r in results}
        return [e for e in self.journal.entries()
                if e["task"] != "signal" and ids & set(e["ids"])]  # fmt: skip

    def signals(self, *results: AsyncResult) -> Counter[str]:
        """How many times each worker signal was sent for *results*' calls."""
        ids = {r.id for r in results}
        return Counter(e["signal"] for e in self.journal.entries()
                       if e["task"] == "signal" and ids & set(e["ids"]))  # fmt: skip


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    broker = require_broker("redis")
    ns = f"t{uuid.uuid4().hex[:10]}"
    cluster = Cluster(broker, ns, Path(tmp_path_factory.mktemp("batch-peer")))
    cluster.configure(include=INCLUDE)
    apps = {p: proj.make_app(broker, ns, {"task_protocol": p}, INCLUDE) for p in (1, 2)}
    try:
        worker = cluster.worker("w1", concurrency=2)
        yield Peer(cluster, worker, apps, Journal(ns))
    finally:
        cluster.stop()
        for app in apps.values():
            app.close()
        Journal(ns).clear()


@PROTOCOLS
def test_always_eager(peer: Peer, protocol: int) -> None:
    """The batch task runs at once, in the caller, as a batch of the one call."""
    app = peer.apps[protocol]
    app.conf.task_always_eager = True
    try:
        assert peer.task(protocol).delay(1).get() == 1
    finally:
        app.conf.task_always_eager = False


@PROTOCOLS
def test_apply(peer: Peer, protocol: int) -> None:
    assert peer.task(protocol).apply(args=(1,)).get() == 1


@PROTOCOLS
def test_flush_interval(peer: Peer, protocol: int) -> None:
    """One call runs alone, once the wait after it passed."""
    sent = time.time()
    result = peer.task(protocol).delay(1)
    assert result.get(timeout=30) == 1
    (one,) = peer.batches(result)
    assert one["n"] == 1 and one["start"] - sent >= WAIT - 0.05


@PROTOCOLS
def test_flush_interval_resets_counter(peer: Peer, protocol: int) -> None:
    """After a batch ran on its wait, the next call alone waits its own wait again."""
    first = peer.task(protocol).delay(1)
    assert first.get(timeout=30) == 1
    sent = time.time()
    second = peer.task(protocol).delay(2)
    assert second.state == states.PENDING
    assert second.get(timeout=30) == 2
    runs = peer.batches(first, second)
    assert [e["n"] for e in runs] == [1, 1] and runs[1]["start"] - sent >= WAIT - 0.05


@PROTOCOLS
def test_flush_calls(peer: Peer, protocol: int) -> None:
    results = [peer.task(protocol).delay(1), peer.task(protocol).delay(3)]
    assert [r.get(timeout=30) for r in results] == [4, 4]
    assert [e["n"] for e in peer.batches(*results)] == [2]


@PROTOCOLS
def test_multi_arg(peer: Peer, protocol: int) -> None:
    results = [peer.task(protocol).delay(1, 2), peer.task(protocol).delay(3, 4)]
    assert [r.get(timeout=30) for r in results] == [10, 10]


@PROTOCOLS
def test_kwarg(peer: Peer, protocol: int) -> None:
    results = [peer.task(protocol).delay(a=1, b=2), peer.task(protocol).delay(a=3, b=4)]
    assert [r.get(timeout=30) for r in results] == [10, 10]


@PROTOCOLS
def test_result(peer: Peer, protocol: int) -> None:
    results = [peer.task(protocol, CUMADD).delay(1), peer.task(protocol, CUMADD).delay(2)]
    assert [r.get(timeout=30) for r in results] == [1, 3]


@PROTOCOLS
def test_signals(peer: Peer, protocol: int) -> None:
    """celery-batches' counts, but ``task_success``: sent once per call here (each call
    ends as a task does), where celery-batches sends it once per batch."""
    published: Counter[str] = Counter()

    def counter(name: str) -> Any:
        def receiver(sender: Any = None, **_: Any) -> None:
            published[name] += sender == ADD or getattr(sender, "name", None) == ADD

        return receiver

    receivers = {
        s: counter(s.name)
        for s in (signals.before_task_publish, signals.after_task_publish, signals.task_sent)
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver, weak=False)
    try:
        results = [peer.task(protocol).delay(1), peer.task(protocol).delay(3)]
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
    assert [r.get(timeout=30) for r in results] == [4, 4]
    assert published == {"before_task_publish": 2, "after_task_publish": 2, "task_sent": 2}
    deadline = time.monotonic() + 10  # the last task_success follows the result
    while peer.signals(*results)["task_success"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert peer.signals(*results) == {
        "task_received": 2,
        "task_prerun": 1,
        "task_postrun": 1,
        "task_success": 2,
    }
    others = [
        e
        for e in peer.journal.entries()
        if e["task"] == "signal"
        and e["signal"] in ("task_unknown", "task_rejected", "task_internal_error")
    ]
    assert others == []


@PROTOCOLS
def test_current_task(peer: Peer, protocol: int) -> None:
    results = [peer.task(protocol).delay(1), peer.task(protocol).delay(3)]
    assert [r.get(timeout=30) for r in results] == [4, 4]
    (prerun,) = [
        e
        for e in peer.journal.entries()
        if e["task"] == "signal"
        and e["signal"] == "task_prerun"
        and e["ids"] == [r.id for r in results]
    ]
    assert prerun["current"] == ADD and prerun["task_id"] == peer.batches(*results)[0]["id"]


@PROTOCOLS
def test_acks_early(peer: Peer, protocol: int) -> None:
    """The one difference kept: celery-batches acks an early-acking task's messages before
    its batch runs; ``batch()`` acks every call after its batch ran (a worker killed
    mid-batch loses nothing), so both are unacked while it runs, and acked after."""
    _acked_after_the_batch(peer, protocol, ACKS, acks_late=False)


@PROTOCOLS
def test_acks_late(peer: Peer, protocol: int) -> None:
    _acked_after_the_batch(peer, protocol, ACKS_LATE, acks_late=True)


def _acked_after_the_batch(peer: Peer, protocol: int, name: str, acks_late: bool) -> None:
    """Both calls of a batch of task *name* unacked while it runs (on the Redis broker),
    both acked once they ended."""
    task = peer.task(protocol, name)
    assert task.acks_late is acks_late
    results = [task.delay(), task.delay()]
    assert [r.get(timeout=30) for r in results] == [None, None]
    (run,) = peer.batches(*results)
    assert run["unacked"] == 2
    _wait_acked(peer)


def _wait_acked(peer: Peer) -> None:
    """Every message of the module's namespace acked (the acks follow the results)."""
    client = peer.journal.client
    deadline = time.monotonic() + 10
    while client.hlen(f"{peer.cluster.ns}.unacked") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.hlen(f"{peer.cluster.ns}.unacked") == 0


def _held_back(peer: Peer, protocol: int, **timing: Any) -> None:
    """A call with a countdown or an ETA 3 s ahead runs in a batch of its own after it; the
    call sent beside it runs alone, on its wait, without waiting for it."""
    sent = time.time()
    first = peer.task(protocol).apply_async(args=(1,))
    later = peer.task(protocol).apply_async(args=(2,), **timing)
    assert first.get(timeout=30) == 1
    assert later.state == states.PENDING
    assert later.get(timeout=30) == 2
    runs = peer.batches(first, later)
    assert [e["ids"] for e in runs] == [[first.id], [later.id]]
    assert runs[1]["start"] - sent >= 3.0 - 0.05


@PROTOCOLS
def test_countdown(peer: Peer, protocol: int) -> None:
    _held_back(peer, protocol, countdown=3)


@PROTOCOLS
def test_eta(peer: Peer, protocol: int) -> None:
    _held_back(peer, protocol, eta=datetime.now(UTC) + timedelta(seconds=3))


@PROTOCOLS
def test_a_call_carries_the_request_fields_and_headers_under_both_protocols(
    peer: Peer, protocol: int
) -> None:
    """Issue 51: what ``SimpleRequest`` gives celery-batches users (``name``,
    ``delivery_info``, ``hostname``, ``reply_to``, ``correlation_id``, ``request_dict``),
    with ``retries``, ``eta``, ``expires`` and the headers, which were empty under
    protocol 1."""
    task = peer.task(protocol)
    results = [task.apply_async(args=(i,), expires=600, headers={"x-peer": "p"})
               for i in (1, 2)]  # fmt: skip
    assert [r.get(timeout=30) for r in results] == [3, 3]
    (run,) = peer.batches(*results)
    for call, result in zip(run["calls"], results, strict=True):
        fields = ("name", "hostname", "correlation_id", "retries", "eta", "routing_key",
                  "header_id", "header_task", "custom", "request_task")  # fmt: skip
        assert {k: call[k] for k in fields} == {
            "name": ADD,
            "hostname": peer.worker.hostname,
            "correlation_id": result.id,
            "retries": 0,
            "eta": None,
            "routing_key": peer.cluster.ns,
            "header_id": result.id,
            "header_task": ADD,
            "custom": "p",
            "request_task": ADD,
        }
        assert call["reply_to"] and call["expires"].startswith(str(datetime.now().year))


@PROTOCOLS
def test_the_migration_guides_bulk_indexing_example(peer: Peer, protocol: int) -> None:
    """docs/migrating-from-celery-batches.rst: 4 documents in one batch, one rejected (it
    fails alone), one throttled (retried alone, then indexed), two indexed."""
    task = peer.task(protocol, "tests.batch.migrated.index")
    tag = f"p{protocol}"
    docs = [
        {"id": f"{tag}-a", "text": "a"},
        {"text": "no id"},
        {"id": f"{tag}-b", "text": "b", "busy": True},
        {"id": f"{tag}-c", "text": "c"},
    ]
    results = [task.delay(doc) for doc in docs]
    outcomes = [(r.get(timeout=30, propagate=False), r.state) for r in results]
    assert [o for i, o in enumerate(outcomes) if i != 1] == [
        (f"{tag}-a", "SUCCESS"), (f"{tag}-b", "SUCCESS"), (f"{tag}-c", "SUCCESS")
    ]  # fmt: skip
    assert outcomes[1][1] == "FAILURE" and type(outcomes[1][0]).__name__ == "RejectedDocument"
    indexed = peer.journal.client.hgetall(f"{peer.cluster.ns}:index")
    assert {k: v for k, v in indexed.items() if k.startswith(tag)} == {
        f"{tag}-a": "a", f"{tag}-b": "b", f"{tag}-c": "c"
    }  # fmt: skip
    assert task.apply(args=({"id": "eager"},)).get() == "eager"
