"""memoize() on two real prefork workers, on Redis and on RabbitMQ (store: Redis): one pair
of workers per broker serves every test, each on keys of its own. Every run journals itself
and returns its own id, so "one run" and "every caller its result" are read from both."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import chord

import celery_extras
import tests.support.tasks_memoize as tasks
from celery_extras.memoize.redis_memo import RedisMemo
from celery_extras.memoize.spec import arguments_key
from celery_extras.store.client import redis_client, store_key
from tests.integration.conftest import Cluster, workers_for_module
from tests.integration.test_stats_cli import extras
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = (tasks.__name__,)
SQUARE, FLAKY, SHORT, BOUNDED = (f"tests.memoize.{n}" for n in ("square", "flaky", "short",
                                                                  "bounded"))  # fmt: skip


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def memo(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:  # fmt: skip
    """Two workers of the memoize tasks on one broker, for the whole module."""
    with workers_for_module(request.param, Path(tmp_path_factory.mktemp("memo")),
                            INCLUDE) as cluster:  # fmt: skip
        yield cluster


def runs(cluster: Cluster, task: str, x: Any) -> list[dict[str, Any]]:
    return [e for e in Journal(cluster.ns).entries()
            if e["task"] == task and e.get("phase") == "run" and e.get("x") == x]  # fmt: skip


def memoized(cluster: Cluster) -> int:
    """The ``memoized`` count of both workers."""
    return sum(cluster.stats(w.hostname).get("extras_policies", {}).get("memoize", {})
               .get("memoized", 0) for w in cluster.workers)  # fmt: skip


def fresh() -> str:
    return uuid.uuid4().hex[:8]


def test_eight_calls_in_turn_make_one_run_and_one_result(memo: Cluster) -> None:
    x, before = fresh(), memoized(memo)
    results = [memo.app.send_task(SQUARE, args=(x,)).get(timeout=60) for _ in range(8)]
    (run,) = runs(memo, SQUARE, x)
    assert results == [{"x": x, "run": run["id"]}] * 8
    wait_for(lambda: memoized(memo) - before == 7, timeout=30, what="7 memoized")


def test_ten_at_once_make_one_run(memo: Cluster) -> None:
    x = fresh()
    sent = [memo.app.send_task(SQUARE, args=(x, 1.0)) for _ in range(10)]
    results = [r.get(timeout=60) for r in sent]
    (run,) = runs(memo, SQUARE, x)
    assert {r["run"] for r in results} == {run["id"]} and len(results) == 10


def test_hits_keep_their_callbacks_and_chord_parts(memo: Cluster) -> None:
    app, x, tag = memo.app, fresh(), fresh()
    first = app.send_task(SQUARE, args=(x,)).get(timeout=60)
    hit = app.signature(SQUARE, args=(x,)).set(link=app.signature("tests.memoize.record",
                                                                  args=(tag,)))  # fmt: skip
    assert hit.apply_async().get(timeout=60) == first
    parts = [app.signature(SQUARE, args=(x,)) for _ in range(3)]
    body = app.signature("tests.memoize.tsum")
    assert chord(parts, body).apply_async().get(timeout=60) == [first["run"]] * 3
    wait_for(lambda: [e for e in Journal(memo.ns).entries() if e.get("tag") == tag],
             timeout=30, what="the hit's callback")  # fmt: skip
    (callback,) = [e for e in Journal(memo.ns).entries() if e.get("tag") == tag]
    assert callback["given"] == first and len(runs(memo, SQUARE, x)) == 1


def test_a_failure_is_not_kept(memo: Cluster) -> None:
    x, store = fresh(), RedisMemo(redis_client(memo.app, background=True), store_key(memo.app))
    with pytest.raises(ValueError, match=f"first run of {x} fails"):
        memo.app.send_task(FLAKY, args=(x,)).get(timeout=60)
    # its result is stored before its worker hears it end: a message sent in between joins it
    wait_for(lambda: not store.running((FLAKY, arguments_key([x], {}))), timeout=30,
             what="the failed run's end")  # fmt: skip
    second = memo.app.send_task(FLAKY, args=(x,)).get(timeout=60)
    assert memo.app.send_task(FLAKY, args=(x,)).get(timeout=60) == second
    assert [e["id"] for e in runs(memo, FLAKY, x)][1:] == [second["run"]]
    assert len(runs(memo, FLAKY, x)) == 2


def test_a_key_runs_again_after_its_ttl_and_after_invalidate(memo: Cluster) -> None:
    app, x = memo.app, fresh()
    first = app.send_task(SHORT, args=(x,)).get(timeout=60)
    wait_for(lambda: app.send_task(SHORT, args=(x,)).get(timeout=60) != first, timeout=30,
             what="a run after the 1 s ttl")  # fmt: skip
    assert len(runs(memo, SHORT, x)) == 2
    y = fresh()
    kept = app.send_task(SQUARE, args=(y,)).get(timeout=60)
    assert celery_extras.invalidate(app.tasks[SQUARE], y) is True
    again = app.send_task(SQUARE, args=(y,)).get(timeout=60)
    assert again != kept and app.send_task(SQUARE, args=(y,)).get(timeout=60) == again
    forgot = extras(memo, "memoize", "--forget", SQUARE, f'"{y}"')
    assert forgot.returncode == 0 and "forgot" in forgot.stdout, forgot.stderr
    assert app.send_task(SQUARE, args=(y,)).get(timeout=60) not in (kept, again)
    assert len(runs(memo, SQUARE, y)) == 3


def test_max_keys_plus_one_keys_keep_max_keys(memo: Cluster) -> None:
    app, xs = memo.app, [fresh() for _ in range(4)]
    firsts = [app.send_task(BOUNDED, args=(x,)).get(timeout=60) for x in xs]
    store = RedisMemo(redis_client(app, background=True), store_key(app))
    # a result is stored a moment before its worker tells the store its run ended
    wait_for(lambda: list(store.listing(BOUNDED)) == xs[:0:-1], timeout=30,
             what="the last three keys kept, most recent first")  # fmt: skip
    assert store.kept(BOUNDED) == 3
    listed = extras(memo, "memoize", BOUNDED).stdout.splitlines()
    assert listed == [f"3 key(s) of {BOUNDED} keep a result", *(f"  '{x}'" for x in xs[:0:-1])]
    assert [app.send_task(BOUNDED, args=(x,)).get(timeout=60) for x in xs[1:]] == firsts[1:]
    assert app.send_task(BOUNDED, args=(xs[0],)).get(timeout=60) != firsts[0]
    assert [len(runs(memo, BOUNDED, x)) for x in xs] == [2, 1, 1, 1]
