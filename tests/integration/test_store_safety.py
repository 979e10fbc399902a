"""Nothing lost in a store that may evict or is full, and no footprint where nothing parks.

The store is a private ``redis-server`` of the test's own, with a small ``maxmemory`` and
the policy under test; the broker is the shared Redis or RabbitMQ. 1,000 countdown tasks
with 4 KB headers under ``extras_eta_store`` would need about 5 MB of store.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_extras.store.client import close_client, redis_client, store_safety
from celery_extras.store.safety import FULL_RECHECK, StoreSafety
from tests.integration.conftest import Cluster
from tests.integration.test_stats_cli import extras
from tests.support import proj
from tests.support.brokers import REDIS_URL, PrivateRedis
from tests.support.journal import Journal
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_eta",)  # no policy: only the ETA store parks
PARKING = ("tests.support.tasks_delay",)
HEADERS = {"pad": "x" * 4096}
OOM_LINE = re.compile(r"delay store: the store failed \(OutOfMemoryError")


@pytest.fixture
def small_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private 3 MB Redis with the ``maxmemory-policy`` the test is parametrized with."""
    policy = getattr(request, "param", "noeviction")
    server = PrivateRedis(tmp_path / "store", "--maxmemory", "3mb", "--maxmemory-policy", policy)
    (tmp_path / "store").mkdir()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def send_countdowns(cluster: Cluster, tags: range, first: float, spread: float) -> None:
    """Countdown tasks ``first``..``first + spread`` s away, each with 4 KB of headers."""
    now = time.time()
    with cluster.app.producer_or_acquire() as producer:
        for i in tags:
            due = now + first + spread * (i - tags.start) / len(tags)
            cluster.app.send_task("tests.delay.eta_task", args=(i,), kwargs={"due": due},
                                  eta=datetime.fromtimestamp(due, UTC), headers=HEADERS,
                                  producer=producer)  # fmt: skip


def ran_once_each(journal: Journal, tags: range, timeout: float) -> None:
    wait_for(lambda: len(journal) >= len(tags), timeout=timeout, interval=0.5,
             what=f"{len(tags)} countdown runs")  # fmt: skip
    time.sleep(2.0)  # a second copy would run right after the first: give it the chance
    runs = Counter(e["tag"] for e in journal.entries())
    twice = [e for e in journal.entries() if runs[e["tag"]] > 1]  # which worker, when, retry
    assert runs == Counter(tags), ({t: n for t, n in runs.items() if n != 1} or "missing", twice)
    early = [e["due"] - e["t"] for e in journal.entries() if e["t"] < e["due"]]
    assert not early, f"{len(early)} ran before their ETA, by up to {max(early):.3f} s"


@pytest.mark.parametrize("small_store", ["allkeys-lru", "volatile-lru"], indirect=True)
def test_an_evicting_store_loses_no_task_and_says_what_it_puts_at_risk(
    cluster: Cluster, journal: Journal, small_store: PrivateRedis
) -> None:
    """allkeys-lru may evict parked tasks: nothing is parked, every task is held in the
    worker. volatile-lru evicts only keys with a TTL, which parked tasks have not: parks go
    on until the store is full, the rest are held, and the full store still releases."""
    policy = redis.Redis.from_url(small_store.url).config_get("maxmemory-policy")
    policy = policy["maxmemory-policy"]
    cluster.configure(include=INCLUDE, extras_redis_url=small_store.url,
                      extras_eta_store=True, extras_eta_threshold=2.0)  # fmt: skip
    worker = cluster.worker("w1", concurrency=2)
    send_countdowns(cluster, range(1000), first=12.0, spread=10.0)
    ran_once_each(journal, range(1000), timeout=90)

    stats = cluster.stats(worker.hostname)
    store, gate = stats["extras_store"], stats["extras_delay_gate"]
    assert store["policy"] == policy
    log = worker.log()
    assert f"maxmemory-policy {policy}, which may evict" in log
    if policy == "allkeys-lru":
        assert store["at_risk"] == ["parked tasks", "revokes", "limit and cap overrides",
                                    "retry failure memory", "concurrency slot holds",
                                    "coalescing holds"]  # fmt: skip
        assert store["parking"] == "refused"
        assert gate["eta_parked"] == 0 and gate["park_refused"] == 1000
        assert "nothing is parked there" in log
        listing = extras(cluster, "delayed").stdout.splitlines()
        assert listing[:2] == [
            "delay store: 0 entries waiting (maxmemory-policy allkeys-lru, may evict parked "
            "tasks, revokes, limit and cap overrides, retry failure memory, concurrency slot "
            "holds, coalescing holds)",
            "  nothing is parked there: set maxmemory-policy noeviction, or "
            "extras_store_allow_eviction = True",
        ]
    else:
        assert store["at_risk"] == [
            "retry failure memory", "concurrency slot holds", "coalescing holds"
        ]  # fmt: skip
        assert "parking" not in store
        print(f"volatile-lru: {gate['eta_parked']} parked, {gate['park_errors']} refused (OOM)")
        assert gate["eta_parked"] > 0 and gate["park_errors"] > 0
        assert gate["eta_parked"] + gate["park_errors"] == 1000
        outages = [line for line in log.splitlines() if "delay store: the store" in line]
        assert len(OOM_LINE.findall(log)) == 1, outages
    assert "released" not in stats["extras_delay"]["mover"] or stats["extras_delay"]["depth"] == 0


def test_a_full_noeviction_store_refuses_parks_and_loses_nothing(
    cluster: Cluster, journal: Journal, small_store: PrivateRedis
) -> None:
    """A ``noeviction`` store at its ``maxmemory`` refuses writes: parks fail (one log line
    for the outage), their tasks stay with the worker; once memory frees, parks go on."""
    client = redis.Redis.from_url(small_store.url)
    filler = 0
    while True:  # fill the store to its maxmemory
        try:
            client.set(f"filler:{filler}", b"f" * 65536)
        except redis.exceptions.OutOfMemoryError:
            break
        filler += 1
    cluster.configure(include=INCLUDE, extras_redis_url=small_store.url,
                      extras_eta_store=True, extras_eta_threshold=2.0)  # fmt: skip
    worker = cluster.worker("w1", concurrency=2)
    send_countdowns(cluster, range(200), first=8.0, spread=4.0)
    wait_for(lambda: cluster.stats(worker.hostname).get("extras_delay_gate", {}).get(
             "park_errors") == 200, timeout=30, interval=0.5, what="200 parks refused")  # fmt: skip
    client.delete(*(f"filler:{i}" for i in range(filler)))
    # a full store is read again at most every FULL_RECHECK s, at a park: parks arriving
    # within that of the last read stay with the worker; these come after it
    time.sleep(FULL_RECHECK + 0.5)
    send_countdowns(cluster, range(200, 400), first=8.0, spread=4.0)
    wait_for(lambda: cluster.stats(worker.hostname)["extras_delay_gate"]["eta_parked"] == 200,
             timeout=30, interval=0.5, what="200 parks once memory freed")  # fmt: skip
    ran_once_each(journal, range(400), timeout=60)
    log = worker.log()
    assert len(OOM_LINE.findall(log)) == 1, "one line for the one outage"
    assert log.count("delay store: the store answers again") == 1
    assert cluster.stats(worker.hostname)["extras_store"]["at_risk"] == []


def active_queues(cluster: Cluster, hostname: str) -> list[str]:
    replies = cluster.app.control.inspect(destination=[hostname], timeout=5).active_queues()
    return sorted(q["name"] for q in (replies or {}).get(hostname, []))


def test_an_app_that_parks_nothing_consumes_exactly_its_queues(cluster: Cluster, ns: str) -> None:
    cluster.configure()  # tests.support.tasks: no limit/retry_policy/coalesce, no ETA store
    worker = cluster.worker("w1", concurrency=2)
    assert active_queues(cluster, worker.hostname) == [ns]
    delay = cluster.stats(worker.hostname)["extras_delay"]
    assert delay == {"due_queues": [], "uses": []}
    assert extras(cluster, "delayed").stdout.splitlines()[1:] == [
        "due queues: none (no limit(), retry_policy() or coalesce(), extras_eta_store off)"
    ]


def test_an_app_that_parks_consumes_the_due_queue_and_says_why(cluster: Cluster, ns: str) -> None:
    cluster.configure(include=PARKING)
    worker = cluster.worker("w1", concurrency=2)
    assert active_queues(cluster, worker.hostname) == [ns, f"{ns}.extras-due"]
    delay = cluster.stats(worker.hostname)["extras_delay"]
    assert delay["due_queues"] == [f"{ns}.extras-due"]
    assert delay["uses"] == [
        "limit() on tests.delay.limited10",
        "limit() on tests.delay.limited20",
        "limit() on tests.delay.limited40",
        "retry_policy() on tests.delay.long_retry",
    ]
    listing = json.loads(extras(cluster, "delayed", "--json").stdout)
    assert listing["due_queues"] == [f"{ns}.extras-due"] and listing["uses"] == delay["uses"]
    assert listing["store"]["policy"] == "noeviction" and listing["store"]["at_risk"] == []


def test_tasks_parked_before_the_eta_store_was_turned_off_still_run(
    cluster: Cluster, journal: Journal, ns: str
) -> None:
    cluster.configure(include=INCLUDE, extras_eta_store=True, extras_eta_threshold=2.0)
    first = cluster.worker("w1", concurrency=2)
    send_countdowns(cluster, range(5), first=10.0, spread=1.0)
    wait_for(lambda: cluster.stats(first.hostname).get("extras_delay_gate", {}).get(
             "eta_parked") == 5, timeout=30, interval=0.5, what="5 parked")  # fmt: skip
    # a restart, as a user turns a setting off (warm: Celery acks a message on the event
    # loop's next turn, and the stats of this one may answer first; a SIGKILL in between
    # leaves the last message unacked, and a worker that no longer parks runs its
    # redelivery as well as its parked entry: see test_delay_faults for kills)
    first.stop()
    cluster.configure(include=INCLUDE, extras_eta_store=False)  # nothing parks any more
    second = cluster.worker("w2", concurrency=2)
    assert active_queues(cluster, second.hostname) == [ns, f"{ns}.extras-due"]
    assert "nothing of this app parks tasks, but 5 entries parked earlier" in second.log()
    ran_once_each(journal, range(5), timeout=60)


def test_the_policy_is_read_on_every_topology(client: Any) -> None:
    """A cluster client sends ``INFO`` to one node unless told: every master is read, and
    the cluster is as safe as its worst master (changed only on the private cluster)."""
    verdict = StoreSafety(lambda: client).check()
    assert (verdict.policy, verdict.risk) == ("noeviction", ())
    assert verdict.persistence in ("none", "aof", "rdb", "aof+rdb"), verdict
    if not hasattr(client, "get_primaries"):
        return
    for node in client.get_primaries():
        client.config_set("maxmemory-policy", "volatile-ttl", target_nodes=node)
        try:
            verdict = StoreSafety(lambda: client).check()
            assert verdict.policy == "volatile-ttl", node
            assert [k.what for k in verdict.risk] == [
                "retry failure memory",
                "concurrency slot holds",
                "coalescing holds",
            ]
        finally:
            client.config_set("maxmemory-policy", "noeviction", target_nodes=node)


def test_the_policy_is_read_again_after_a_reconnect(small_store: PrivateRedis, ns: str) -> None:
    """A reconnect may reach another Redis (a failover): the verdict is read again then,
    not only every 60 s."""
    app = proj.make_app(REDIS_URL, ns, {"extras_redis_url": small_store.url})
    admin = redis.Redis.from_url(small_store.url)
    try:
        safety = store_safety(app)
        assert safety.parks_allowed() and safety.verdict is not None
        admin.config_set("maxmemory-policy", "allkeys-lru")
        assert safety.parks_allowed(), "read at most every 60 s while connected"
        admin.client_kill_filter(_type="normal", skipme=True)  # every connection of ours
        redis_client(app).ping()  # reconnects
        assert not safety.parks_allowed()
        assert safety.verdict is not None and safety.verdict.policy == "allkeys-lru"
    finally:
        close_client(app)
        app.close()


NO_DISK = "the store's Redis keeps nothing on disk (no AOF, no RDB snapshots)"


@pytest.mark.parametrize("appendonly", ["yes", "no"])
def test_a_store_that_keeps_nothing_on_disk_is_warned_of_once(
    cluster: Cluster, tmp_path: Path, appendonly: str
) -> None:
    (tmp_path / "store").mkdir()
    store = PrivateRedis(tmp_path / "store", "--appendonly", appendonly).start()
    try:
        cluster.configure(extras_redis_url=store.url)
        worker = cluster.worker("w1", concurrency=2)
        stats = cluster.stats(worker.hostname)["extras_store"]
        assert stats["persistence"] == ("aof" if appendonly == "yes" else "none")
        assert worker.log().count(NO_DISK) == (0 if appendonly == "yes" else 1)
    finally:
        store.stop()
