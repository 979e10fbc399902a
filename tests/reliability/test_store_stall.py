"""A store that stalls, is down or is SIGSTOPped for 20 s costs the worker nothing but its
gated tasks' wait (issue 33): it answers ``ping`` within 1 s throughout, 50 tasks without a
policy run at their pace, the outage is logged once by the worker's process, and every gated
task sent meanwhile runs once afterwards.

The store is a private Redis behind a TCP proxy of the test's (which can stop forwarding:
connections accepted, nothing answered); the broker and the result backend are the shared
Redis, which never stalls.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster
from tests.support.brokers import PrivateRedis
from tests.support.journal import Journal
from tests.support.outages import store_outages, store_recoveries
from tests.support.proxy import StallingProxy
from tests.support.workers import wait_for

INCLUDE = ("tests.support.tasks_stall",)
FREE, LIMITED, CAPPED, COALESCED, DEBOUNCED, ONE_SLOT = (
    f"tests.stall.{n}" for n in ("free", "limited", "capped", "coalesced", "debounced", "one_slot")
)
GATED = (LIMITED, CAPPED, COALESCED)
#: How long the store stalls, seconds.
STALL = 20.0


class Stall:
    """Stalls the store one way: ``blackhole`` (the proxy stops forwarding), ``sigstop`` (the
    Redis is stopped by SIGSTOP: the kernel still accepts connections) or ``refused`` (the
    Redis is shut down: connections refused)."""

    def __init__(self, mode: str, store: PrivateRedis, proxy: StallingProxy) -> None:
        self.mode, self.store, self.proxy = mode, store, proxy

    def begin(self) -> None:
        if self.mode == "blackhole":
            self.proxy.stall()
        elif self.mode == "sigstop":
            assert self.store.proc is not None
            os.kill(self.store.proc.pid, signal.SIGSTOP)
        else:
            self.store.stop()

    def end(self) -> None:
        if self.mode == "blackhole":
            self.proxy.resume()
        elif self.mode == "sigstop":
            assert self.store.proc is not None
            os.kill(self.store.proc.pid, signal.SIGCONT)
        else:
            self.store.start()


def main_process_lines(log: str) -> str:
    return "\n".join(line for line in log.splitlines() if "MainProcess" in line)


@pytest.mark.exclusive  # it measures a latency (ping) and a pace (50 tasks)
@pytest.mark.parametrize(  # a stall on both brokers; the other ways, whose path through the
    ("broker", "mode"),  # store's client is the same, on one
    [("redis", "blackhole"), ("rabbitmq", "blackhole"), ("redis", "sigstop"), ("redis", "refused")],
    indirect=["broker"],
)
def test_a_store_that_stalls_costs_only_the_gated_tasks_their_wait(
    mode: str, cluster: Cluster, send: Callable[..., Any], journal: Journal, tmp_path: Path
) -> None:
    store = PrivateRedis(tmp_path).start()
    proxy = StallingProxy(("127.0.0.1", store.port)).start()
    stall = Stall(mode, store, proxy)
    try:
        cluster.configure(include=INCLUDE, extras_redis_url=proxy.url, extras_eta_store=True,
                          extras_eta_threshold=1.0)  # fmt: skip
        worker = cluster.worker("w1", concurrency=2)
        warm = [send(name, "warm") for name in (FREE, *GATED)]  # connections made, scripts loaded
        assert [r.get(timeout=60) for r in warm] == ["warm"] * 4

        stall.begin()
        began = time.monotonic()
        gated = [send(name, f"{name}-{i}") for i in range(5) for name in GATED]
        eta = [send(FREE, f"eta-{i}", countdown=3) for i in range(3)]  # cannot be parked
        time.sleep(1.0)  # the gated tasks meet the stall first (not a wait for a condition)
        sent = time.monotonic()
        free = [send(FREE, f"free-{i}") for i in range(50)]
        assert [r.get(timeout=30) for r in free] == [f"free-{i}" for i in range(50)]
        free_took = time.monotonic() - sent
        pings: list[float] = []
        while time.monotonic() - began < STALL:
            asked = time.monotonic()
            replies = cluster.app.control.ping(destination=[worker.hostname], timeout=1.0)
            pings.append(time.monotonic() - asked if replies else float("inf"))
            time.sleep(0.5)
        log = main_process_lines(worker.log())
        stall.end()

        print(f"{mode}: 50 policy-free tasks in {free_took:.2f} s; {len(pings)} pings, "
              f"slowest {max(pings):.2f} s")  # fmt: skip
        assert free_took <= 3.0
        assert len(pings) >= 10 and max(pings) <= 1.0, pings
        (outage,) = store_outages(log)  # one line for the process, naming each user
        for user in ("global limits", "concurrency slots", "coalescing holds", "delay store"):
            assert f"{user}: " in outage, outage

        names = {r.id: r.name for r in gated + eta}

        def not_run() -> str:
            ran = {e["id"] for e in journal.entries()}
            return ", ".join(f"{names[i]}[{i}]" for i in set(names) - ran)

        wait_for(
            lambda: not not_run(),
            timeout=120,
            interval=0.5,
            what=lambda: f"every task sent during the stall to run; not: {not_run()}",
        )
        runs = Counter(e["id"] for e in journal.entries() if e["id"] in names)
        assert set(runs.values()) == {1}  # none twice
        wait_for(lambda: store_recoveries(main_process_lines(worker.log())), timeout=30,
                 what="the end of the outage logged")  # fmt: skip
        log = main_process_lines(worker.log())
        assert len(store_outages(log)) == 1 and len(store_recoveries(log)) == 1, log[-3000:]
    finally:
        if mode == "sigstop" and store.proc is not None and store.proc.poll() is None:
            os.kill(store.proc.pid, signal.SIGCONT)
        proxy.close()
        store.stop()


@pytest.mark.parametrize(
    ("task", "on_store_error"),
    [(COALESCED, None), (DEBOUNCED, None), (ONE_SLOT, "delay"), (ONE_SLOT, "local")],
)
def test_an_ask_the_store_did_but_never_answered_is_asked_again_as_the_same_holder(
    task: str, on_store_error: str | None, cluster: Cluster, send: Callable[..., Any],
    journal: Journal, tmp_path: Path,
) -> None:  # fmt: skip
    """The path to the store stalls as a gate asks: the ask times out, yet reaches the store
    when the path comes back, before the gate asks again. The gate asks again as the holder
    the store already knows; a global slot's task that ran meanwhile on the worker's own
    slots (``on_store_error='local'``) has the slot it left in the store freed once the
    store answers. The task runs once, and its key is free again for the next. (Asked as
    another holder, a coalesced task was covered by its own lost run, acked and never run;
    a global slot stayed taken until its lease, 300 s here, ran out.)"""
    store = PrivateRedis(tmp_path).start()
    proxy = StallingProxy(("127.0.0.1", store.port)).start()
    try:
        conf = {"extras_concurrency_on_store_error": on_store_error} if on_store_error else {}
        cluster.configure(include=INCLUDE, extras_redis_url=proxy.url, **conf)
        worker = cluster.worker("w1", concurrency=2)
        assert send(task, "warm").get(timeout=60) == "warm"  # connection made, script loaded

        def stats(*path: str) -> Any:
            """*worker*'s ``inspect stats`` at *path*."""
            value: Any = cluster.stats(worker.hostname)
            for part in path:
                value = (value or {}).get(part)
            return value

        wait_for(lambda: stats("extras_store_line", "unanswered") == 0,
                 what="the warm task's ending answered")  # fmt: skip

        proxy.stall()
        lost = send(task, "lost-reply")
        wait_for(lambda: store_outages(main_process_lines(worker.log())), timeout=30,
                 what="the ask timed out")  # fmt: skip
        proxy.resume()  # the stalled ask reaches the store now
        assert lost.get(timeout=60) == "lost-reply"
        if task == ONE_SLOT:  # the next asks the store, not the worker's own slots
            wait_for(lambda: stats("extras_policies", "concurrency", "store") == "ok", timeout=30,
                     what="the concurrency slots' store answering again")  # fmt: skip
        assert send(task, "next").get(timeout=60) == "next"
        runs = Counter(e["tag"] for e in journal.entries() if e["task"] == task)
        assert runs == {"warm": 1, "lost-reply": 1, "next": 1}
    finally:
        proxy.close()
        store.stop()
