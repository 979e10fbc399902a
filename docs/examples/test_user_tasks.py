"""A user's tests of their own tasks with celery-extras' pytest plugin (docs: "Testing your
tasks"). The project's CI copies this file out of the repository and runs it there."""

import threading

import pytest
from celery import shared_task

from celery_extras import (
    ExponentialBackoff,
    batch,
    clock,
    coalesce,
    concurrency,
    limit,
    retry_policy,
)

STARTED: dict[str, list[float]] = {}  # task name -> simulated start times


def started(name: str) -> None:
    STARTED.setdefault(name, []).append(clock.wall())


@limit("1/s")
@shared_task
def ping(i):
    started("ping")
    return i


@retry_policy(on=(ConnectionError,), policy=ExponentialBackoff(base=2.0, cap=60))
@shared_task
def fetch(url):
    started("fetch")
    if len(STARTED["fetch"]) <= 3:  # down for the first three tries
        raise ConnectionError(url)
    return "page"


@coalesce(key=lambda args, kwargs: args[0])
@shared_task
def reindex(account, version):
    started("reindex")
    return version


RELEASE = threading.Event()
RUNNING = {"now": 0, "most": 0}
LOCK = threading.Lock()


@concurrency(2)
@shared_task
def export(report):
    with LOCK:
        RUNNING["now"] += 1
        RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
    RELEASE.wait(30)
    with LOCK:
        RUNNING["now"] -= 1
    return report


@batch(size=100, wait=5.0)
@shared_task
def index(calls):
    started("index")
    return [call.args[0].upper() for call in calls]


@shared_task
def remind(user):
    started("remind")
    return user


@pytest.fixture(autouse=True)
def _fresh():
    STARTED.clear()
    RELEASE.clear()
    RUNNING.update(now=0, most=0)


def since(extras_clock, name):
    return [round(t - extras_clock.start, 3) for t in STARTED.get(name, [])]


def test_a_limit_of_one_a_second_over_thirty_tasks(extras_app, extras_worker, extras_clock):
    assert ping.app is extras_app  # module-level tasks are the plugin app's
    results = [ping.delay(i) for i in range(30)]
    assert results[0].get(timeout=10) == 0
    for second in range(1, 30):
        extras_clock.advance(1)
        assert results[second].get(timeout=10) == second
        assert not results[second + 1 :] or not results[second + 1].ready()
    assert since(extras_clock, "ping") == [float(s) for s in range(30)]


def test_a_retry_policy_waits_2_4_and_8_seconds(extras_worker, extras_clock):
    result = fetch.delay("https://example.com")
    extras_clock.advance(13.9)
    assert not result.ready()  # the fourth try is due at 14 s
    extras_clock.advance(0.1)
    assert result.get(timeout=10) == "page"
    assert since(extras_clock, "fetch") == [0.0, 2.0, 6.0, 14.0]


def test_a_coalesced_key_runs_once_for_twenty_messages(extras_worker, extras_clock):
    results = [reindex.delay("acme", version) for version in range(20)]
    extras_clock.advance(0)  # let the worker take them all at this instant
    assert [r.get(timeout=10) for r in results] == [0] * 20  # all covered by the one run
    assert since(extras_clock, "reindex") == [0.0]


def test_a_concurrency_cap_of_two(extras_worker):
    results = [export.delay(n) for n in range(6)]
    deadline = threading.Event()
    while RUNNING["most"] < 2 and not deadline.wait(0.01):
        pass
    deadline.wait(0.2)  # the four others wait for a slot, none starts
    assert RUNNING["most"] == 2
    RELEASE.set()
    assert sorted(r.get(timeout=10) for r in results) == list(range(6))
    assert RUNNING["most"] == 2


def test_a_parked_eta_task_runs_once_when_due(extras_worker, extras_clock, extras_store):
    result = remind.apply_async(("ada",), countdown=86400)
    extras_clock.advance(86399)
    assert not result.ready()
    extras_clock.advance(1)
    assert result.get(timeout=10) == "ada"
    extras_clock.advance(3600)  # and once only
    assert since(extras_clock, "remind") == [86400.0]


def test_a_batch_runs_once_its_wait_has_passed(extras_worker, extras_clock):
    results = [index.delay(word) for word in ("a", "b", "c")]
    extras_clock.advance(4.9)
    assert not any(r.ready() for r in results) and since(extras_clock, "index") == []
    extras_clock.advance(0.1)  # five seconds after the first call: one call of three
    assert [r.get(timeout=10) for r in results] == ["A", "B", "C"]
    assert since(extras_clock, "index") == [5.0]
