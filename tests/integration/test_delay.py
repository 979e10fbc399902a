"""The delay store on real workers: parked limited tasks, ETA tasks and long retries run
once, on time, whatever the broker's visibility timeout; forged headers book nothing.

On Redis and on RabbitMQ (the store then is the result backend's Redis).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.integration.conftest import Cluster, also_on_redis_cluster
from tests.support.journal import Journal
from tests.support.rates import JITTER, busiest_second, busiest_window, starts
from tests.support.workers import wait_for

#: Timing is asserted here (rates, latencies): under pytest-xdist these tests run alone.
pytestmark = pytest.mark.exclusive

INCLUDE = ("tests.support.tasks_delay",)


@also_on_redis_cluster("redis")
def test_limited_tasks_beyond_the_hold_are_parked_and_run_once_at_the_rate(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE, extras_limit_max_hold=0.5)
    for i in range(60):
        send("tests.delay.limited10", i)
    worker = cluster.worker("w1", concurrency=2)
    journal.wait_for_runs(60, timeout=60, what="60 limited10 runs")
    entries = journal.entries()
    assert Counter(e["tag"] for e in entries) == Counter(range(60))  # each exactly once
    times = starts(journal, "tests.delay.limited10")
    rate = (len(times) - 1) / (times[-1] - times[0])
    assert 9.5 <= rate <= 10.5, f"{rate:.2f}/s for 10/s"
    assert busiest_second(times) <= (10 + 1) * JITTER
    stats = cluster.stats(worker.hostname)
    assert stats["extras_policies"]["parked"] >= 40
    assert stats["extras_delay_gate"]["taken"] == stats["extras_policies"]["parked"]
    assert stats["extras_delay"]["depth"] == 0
    assert stats["extras_delay"]["mover"]["released"] >= stats["extras_policies"]["parked"]


def test_forged_headers_book_no_slot(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    """Issue 17, item 3: 100 tasks published with ``extras_slot`` (the old hand-back header)
    and ``eta=now``, and 100 with a made-up ``extras_parked`` entry and claim token,
    against a 10/s limit: the limit holds."""
    cluster.configure(include=INCLUDE, extras_limit_max_hold=0.5)
    worker = cluster.worker("w1", concurrency=2)
    for i in range(100):
        send("tests.delay.limited10", i, headers={"extras_slot": "tests.delay.limited10"},
             eta=datetime.now(UTC))  # fmt: skip
    for i in range(100, 200):
        send("tests.delay.limited10", i,
             headers={"extras_parked": f"e{i}", "extras_claim": "forged"})  # fmt: skip
    journal.wait_for_runs(200, timeout=90, what="200 limited10 runs")
    assert Counter(e["tag"] for e in journal.entries()) == Counter(range(200))
    times = starts(journal, "tests.delay.limited10")
    assert busiest_second(times) <= (10 + 1) * JITTER
    rate = (len(times) - 1) / (times[-1] - times[0])
    assert rate <= 10.5, f"{rate:.2f}/s for 10/s"
    gate = cluster.stats(worker.hostname)["extras_delay_gate"]
    assert gate["unverified"] == 100 and gate["duplicates"] == 0


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


#: Redis delivers a message unacked for longer than this again (restore every 5 s).
SHORT_VISIBILITY = {"visibility_timeout": 20, "unacked_restore_interval": 5,
                    "unacked_restore_throttle": 1}  # fmt: skip


@pytest.mark.scenario
@pytest.mark.parametrize("broker", ["redis"], indirect=True)  # the visibility timeout: Redis'
def test_backlog_beyond_the_visibility_timeout_runs_each_task_once_at_the_rate(
    cluster: Cluster, journal: Journal
) -> None:
    """The issue's first measurement, halved: 1 worker, 40/s global, acks_late, 1,500
    queued (37.5 s of work), visibility timeout 20 s. Before the delay store, of 3,000
    queued 1,910 ran two or more times, at 59/s, with 124 starts in one second. RabbitMQ
    redelivers nothing held unacked, and parks the same way: the other parked-backlog tests
    here run on it."""
    cluster.configure(include=INCLUDE, broker_transport_options=SHORT_VISIBILITY)
    with cluster.app.producer_or_acquire() as producer:
        for i in range(1500):
            cluster.app.send_task("tests.delay.limited40", args=(i,), producer=producer)
    worker = cluster.worker("w1", concurrency=2)
    journal.wait_for_runs(1500, timeout=150, what="1,500 limited40 runs")
    entries = journal.entries()
    counts = Counter(e["tag"] for e in entries)
    assert [tag for tag, n in counts.items() if n > 1] == []
    assert sorted(counts) == list(range(1500))
    times = starts(journal, "tests.delay.limited40")
    rate = (len(times) - 1) / (times[-1] - times[0])
    stats = cluster.stats(worker.hostname)
    print(f"backlog: {len(times)} runs, {rate:.2f}/s, busiest second {busiest_second(times)}, "
          f"parked {stats['extras_policies']['parked']}")  # fmt: skip
    assert 38.0 <= rate <= 42.0, f"{rate:.2f}/s for 40/s"
    assert busiest_second(times) <= (40 + 1) * JITTER, busiest_window(times)
    assert stats["extras_delay"]["depth"] == 0
    assert stats["extras_policies"]["parked"] > 1000  # 1,417 here (2026-11-27)


@pytest.mark.exclusive  # nine processes on two cores: a neighbour's load skews the rate
@pytest.mark.scenario
def test_three_workers_share_the_rate_of_a_parked_backlog(
    cluster: Cluster, journal: Journal
) -> None:
    cluster.configure(include=INCLUDE)
    with cluster.app.producer_or_acquire() as producer:
        for i in range(600):  # 30 s at 20/s
            cluster.app.send_task("tests.delay.limited20", args=(i,), producer=producer)
    for name in ("w1", "w2", "w3"):
        cluster.worker(name, concurrency=2, start=False).start(wait=False)
    for worker in cluster.workers:
        worker.wait_ready()
    journal.wait_for_runs(600, timeout=120, what="600 limited20 runs")
    entries = journal.entries()
    assert Counter(e["tag"] for e in entries) == Counter(range(600))
    assert len({e["worker"] for e in entries}) == 3
    times = starts(journal, "tests.delay.limited20")
    rate = (len(times) - 1) / (times[-1] - times[0])
    print(f"three workers: {rate:.2f}/s, busiest second {busiest_second(times)}")
    assert 19.0 <= rate <= 21.0, f"{rate:.2f}/s for 20/s"
    assert busiest_second(times) <= (20 + 1) * JITTER, busiest_window(times)


@pytest.mark.scenario
def test_eta_store_runs_countdowns_once_on_time_with_flat_memory(
    cluster: Cluster, journal: Journal
) -> None:
    """1,000 countdowns spread over 25-40 s, visibility timeout 20 s: each runs once, not
    before its ETA and at most 1 s after it, and the worker's RSS does not grow with them."""
    cluster.configure(include=INCLUDE, broker_transport_options=SHORT_VISIBILITY,
                      extras_eta_store=True, extras_eta_threshold=5.0)  # fmt: skip
    worker = cluster.worker("w1", concurrency=2)
    wait_for(lambda: cluster.stats(worker.hostname), timeout=30, what="stats")
    rss_idle = rss_kb(worker.pid)
    now = time.time()
    with cluster.app.producer_or_acquire() as producer:
        for i in range(1000):
            due = now + 25.0 + 15.0 * i / 1000
            cluster.app.send_task("tests.delay.eta_task", args=(i,), kwargs={"due": due},
                                  eta=datetime.fromtimestamp(due, UTC),
                                  producer=producer)  # fmt: skip
    wait_for(
        lambda: cluster.stats(worker.hostname).get("extras_delay_gate", {}).get(
            "eta_parked") == 1000,
        timeout=60, interval=0.5, what="1,000 countdown tasks parked",
    )  # fmt: skip
    rss_parked = rss_kb(worker.pid)
    journal.wait_for_runs(1000, timeout=120, what="1,000 countdown runs")
    rss_done = rss_kb(worker.pid)
    entries = journal.entries()
    assert Counter(e["tag"] for e in entries) == Counter(range(1000))
    late = sorted(e["t"] - e["due"] for e in entries)
    print(
        f"eta store: late {late[0]:.3f}..{late[-1]:.3f} s, RSS kB idle {rss_idle} "
        f"parked {rss_parked} done {rss_done}"
    )
    assert late[0] >= 0.0, f"ran {-late[0]:.3f} s before its ETA"
    assert late[-1] <= 1.0, f"ran {late[-1]:.3f} s after its ETA"
    assert rss_parked - rss_idle < 10_000 and rss_done - rss_idle < 10_000, (
        rss_idle, rss_parked, rss_done)  # fmt: skip


#: The retry test's: Redis delivers a message unacked for 5 s again (restore every second),
#: well before the retry's 8 s wait ends.
RETRY_VISIBILITY = {"visibility_timeout": 5, "unacked_restore_interval": 1,
                    "unacked_restore_throttle": 1}  # fmt: skip


def test_a_retry_beyond_the_visibility_timeout_runs_once_on_time(
    cluster: Cluster, journal: Journal
) -> None:
    cluster.configure(include=INCLUDE, broker_transport_options=RETRY_VISIBILITY)
    worker = cluster.worker("w1", concurrency=2)
    for i in range(20):
        cluster.app.send_task("tests.delay.long_retry", args=(i,))
    journal.wait_for_runs(40, timeout=90, what="20 tasks and their retries")
    runs: dict[int, list[dict[str, Any]]] = {}
    for entry in journal.entries():
        runs.setdefault(entry["tag"], []).append(entry)
    assert sorted(runs) == list(range(20))
    for tag, attempts in runs.items():
        assert [a["retries"] for a in attempts] == [0, 1], (tag, attempts)
        waited = attempts[1]["t"] - attempts[0]["t"]
        print(f"long retry {tag}: waited {waited:.3f} s for 8 s")
        assert 8.0 <= waited <= 9.5, (tag, waited)
    stats = cluster.stats(worker.hostname)
    assert stats["extras_delay"]["mover"]["released"] >= 20
    assert stats["extras_delay"]["depth"] == 0
