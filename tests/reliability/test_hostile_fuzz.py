"""Fuzz against a real worker (hypothesis): every celery-extras control command and every
stored key it reads, fed arbitrary JSON. The worker answers or logs, and keeps serving
limited and plain tasks (issue 17). The pure readers are fuzzed in microseconds in
``tests/unit/test_fuzz.py``; this is the end-to-end check that none of it kills a worker."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_extras.store.client import redis_client
from celery_extras.sync.revoke_store import RevokeStore
from tests.integration.conftest import Cluster
from tests.support.journal import Journal
from tests.unit.test_fuzz import SMALL_JSON

INCLUDE = ("tests.support.tasks_reliability",)
LIMITED = "tests.reliability.limited"
COMMANDS = {  # command: its argument names
    "extras_limit": ("task_name", "rate", "burst", "key", "limit"),
    "extras_limit_reset": ("task_name", "key", "limit"),
    "extras_revoked": ("limit",),
    "extras_sync_hello": ("from_node", "clock"),
}
ARGUMENTS = st.sampled_from(sorted(COMMANDS)).flatmap(
    lambda command: st.tuples(
        st.just(command),
        st.fixed_dictionaries(
            {}, optional={name: SMALL_JSON | st.just(LIMITED) for name in COMMANDS[command]}
        ),
    )
)
REAL_WORKER = settings(
    max_examples=40, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip


def still_serves(cluster: Cluster, send: Callable[..., Any], tag: str) -> None:
    worker = cluster.workers[0]
    assert worker.alive(), worker.log()[-3000:]
    assert send(LIMITED, tag).get(timeout=30) == tag
    assert send("tests.noop", tag).get(timeout=30) == tag


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_control_commands_and_store_contents_of_any_json_kill_no_worker(
    cluster: Cluster, send: Callable[..., Any], journal: Journal
) -> None:
    cluster.configure(include=INCLUDE, extras_sync_interval=0.5)
    worker = cluster.worker("w1")
    replies: list[int] = []

    @REAL_WORKER
    @given(call=ARGUMENTS)
    def control(call: tuple[str, dict[str, Any]]) -> None:
        command, arguments = call
        answer = cluster.app.control.broadcast(
            command, arguments=arguments, reply=True, timeout=3, destination=[worker.hostname]
        )
        if command != "extras_sync_hello":  # it answers a neighbour, not itself or None
            assert len(answer) == 1, (command, arguments, answer)
            replies.append(len(json.dumps(answer)))

    control()
    still_serves(cluster, send, "after-control")
    assert max(replies) < 70_000  # extras_revoked lists up to 10,000 ids; errors are short

    store = redis_client(cluster.app)
    revokes = RevokeStore(store, cluster.ns, 1000)
    keys = [f"{cluster.ns}:bucket:{LIMITED}:", *revokes.shard_keys[0], *revokes.shard_keys[5]]

    @REAL_WORKER
    @given(value=SMALL_JSON, which=st.sampled_from(range(len(keys) + 1)))
    def stored(value: Any, which: int) -> None:
        text = json.dumps(value)
        if which == len(keys):
            store.hset(f"{cluster.ns}:limits", LIMITED, text)
        else:
            store.set(keys[which], text)

    stored()
    still_serves(cluster, send, "after-garbage")
    for key in [*keys, f"{cluster.ns}:limits"]:
        store.delete(key)
    still_serves(cluster, send, "after-cleanup")
    log = worker.log()
    assert "pidbox command error" not in log and "Traceback" not in log, log[-5000:]
