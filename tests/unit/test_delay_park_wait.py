"""A park waits for a replica (``WAIT``) before it counts: the decisions, on fakes.

:class:`RedisDelayStore` pipelines the park script and ``WAIT`` on one connection and
withdraws a park no replica acknowledged; :class:`Parker` turns that into the store's
failure path (the caller keeps the message), logged once, tried again after a while.
The same rules run against real Redis, Redis Cluster and a Sentinel set in
``tests/integration/test_delay_store.py`` and ``tests/reliability/test_park_replicas.py``.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from celery import Celery
from redis.exceptions import NoScriptError

import celery_extras
from celery_extras.delay.parking import REPLICA_RETRY, Park, Parker, park_replicas
from celery_extras.delay.redis_store import (
    PARK,
    WITHDRAW,
    ParkNotReplicated,
    RedisDelayStore,
    delay_keys,
)
from celery_extras.store.client import LazyCluster
from tests.support.clock import FakeClock
from tests.unit.test_delay_core import make_entry


class FakeScript:
    def __init__(self, client: FakeClient, text: str) -> None:
        self.client, self.text, self.sha = client, text, f"sha-{len(text)}"

    def __call__(self, keys: list[str], args: list[Any], client: Any = None) -> Any:
        self.client.calls.append((self.text, list(args)))
        return self.client.replies[self.text].pop(0)


class FakePipe:
    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.queued: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any, **options: Any) -> None:
        self.queued.append((*args, options) if options else args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        assert raise_on_error is False  # errors come back per command
        self.client.pipelines.append(self.queued)
        return self.client.pipeline_replies.pop(0)


class FakeClient:
    """Scripts and pipelines answering from queues of replies, recording what was sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any]]] = []
        self.replies: dict[str, list[Any]] = {PARK: [], WITHDRAW: []}
        self.pipelines: list[list[tuple[Any, ...]]] = []
        self.pipeline_replies: list[list[Any]] = []
        self.loaded: list[str] = []

    def register_script(self, text: str) -> FakeScript:
        return FakeScript(self, text)

    def pipeline(self, transaction: bool = True) -> FakePipe:
        assert transaction is False  # WAIT must not sit in a MULTI
        return FakePipe(self)

    def script_load(self, text: str) -> str:
        self.loaded.append(text)
        return "sha"


class FakeCluster(LazyCluster, FakeClient):
    """A cluster client: ``WAIT`` must name the node holding the keys."""

    def __init__(self) -> None:
        FakeClient.__init__(self)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

    def register_script(self, text: str) -> FakeScript:  # type: ignore[override]
        return FakeScript(self, text)

    def get_node_from_key(self, key: str) -> str:
        return f"node-of:{key}"


def store_on(client: Any, replicas: int = 1) -> RedisDelayStore:
    return RedisDelayStore(client, "p", replicas=replicas, replica_wait=0.25)


def test_without_replicas_a_park_is_the_script_alone() -> None:
    client = FakeClient()
    client.replies[PARK] = [1, 0]
    store = store_on(client, replicas=0)
    assert store.park("e1", make_entry(), 5.0) is True
    assert store.park("e1", make_entry(), 5.0) is False
    assert [c[0] for c in client.calls] == [PARK, PARK] and client.pipelines == []


def test_a_park_a_replica_acknowledged_counts_after_one_round_trip() -> None:
    client = FakeClient()
    client.pipeline_replies = [[1, 1], [0, 2]]
    store = store_on(client)
    assert store.park("e1", make_entry(), 5.0) is True
    assert store.park("e1", make_entry(), 5.0) is False  # known, and acknowledged: it stands
    (evalsha, wait) = client.pipelines[0]
    assert evalsha[:3] == ("EVALSHA", store._park.sha, 4) and evalsha[3:7] == tuple(
        delay_keys("p")[k] for k in ("due", "meta", "msg", "parked")
    )
    assert evalsha[7:10] == ("", "e1", 5000)  # the time first: "" is the server's own
    assert wait == ("WAIT", 1, 250)
    assert client.calls == []  # nothing withdrawn


def test_a_park_no_replica_acknowledged_is_withdrawn_and_fails() -> None:
    client = FakeClient()
    client.pipeline_replies = [[1, 0]]
    client.replies[WITHDRAW] = [1]
    with pytest.raises(ParkNotReplicated, match="0 of 1 replica"):
        store_on(client).park("e1", make_entry(), 5.0)
    assert client.calls == [(WITHDRAW, ["e1"])]


def test_a_park_a_mover_claimed_before_it_could_be_withdrawn_stands() -> None:
    """A copy may be published already: failing the park too would run the task twice."""
    client = FakeClient()
    client.pipeline_replies = [[1, 0]]
    client.replies[WITHDRAW] = [0]
    assert store_on(client).park("e1", make_entry(), 0.0) is True


def test_two_replicas_asked_one_acknowledged_is_not_enough() -> None:
    client = FakeClient()
    client.pipeline_replies = [[1, 1]]
    client.replies[WITHDRAW] = [1]
    with pytest.raises(ParkNotReplicated, match="1 of 2"):
        store_on(client, replicas=2).park("e1", make_entry(), 5.0)


def test_a_server_without_the_script_gets_it_and_the_park_is_sent_again() -> None:
    client = FakeClient()
    client.pipeline_replies = [[NoScriptError("NOSCRIPT"), 1], [1, 1]]
    assert store_on(client).park("e1", make_entry(), 5.0) is True
    assert client.loaded == [PARK] and len(client.pipelines) == 2


@pytest.mark.parametrize("which", [0, 1])
def test_an_error_in_either_reply_is_raised(which: int) -> None:
    client = FakeClient()
    reply: list[Any] = [1, 1]
    reply[which] = redis.ResponseError("READONLY You can't write against a read only replica.")
    client.pipeline_replies = [reply]
    with pytest.raises(redis.ResponseError, match="READONLY"):
        store_on(client).park("e1", make_entry(), 5.0)


def test_on_a_cluster_wait_goes_to_the_node_holding_the_keys() -> None:
    client = FakeCluster()
    client.pipeline_replies = [[1, 1]]
    store = store_on(client)
    assert store.park("e1", make_entry(), 5.0) is True
    wait = client.pipelines[0][1]
    assert wait == ("WAIT", 1, 250, {"target_nodes": f"node-of:{delay_keys('p')['due']}"})


# -- Parker: the failure path -----------------------------------------------------------------


class RefusingStore:
    """A delay store whose replicas acknowledge nothing until :attr:`ok`."""

    def __init__(self) -> None:
        self.ok = False
        self.parks = 0

    def park(self, entry_id: str, entry: Any, delay: float) -> bool:
        self.parks += 1
        if not self.ok:
            raise ParkNotReplicated("0 of 1 replica(s) acknowledged the park within 1 s")
        return True


def app_with(**conf: Any) -> Celery:
    app = Celery("t", set_as_current=False)
    app.conf.update(conf)
    celery_extras.install(app)
    return app


def test_parker_keeps_the_message_logs_once_and_retries_after_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    parker = Parker(app_with(broker_url="redis://localhost:1/0"), clock=clock)
    store = parker._store = RefusingStore()  # type: ignore[assignment]
    parker.safety.refusal = lambda: None  # type: ignore[method-assign]  # no INFO to read
    caplog.set_level(logging.WARNING, "celery_extras.delay.parking")
    assert parker.park("e1", make_entry("t1"), 60.0) is Park.KEPT
    assert parker.park("e2", make_entry("t2"), 60.0) is Park.KEPT  # at once, the store not asked
    assert store.parks == 1 and parker.counts["park_unreplicated"] == 2
    clock.now += REPLICA_RETRY
    assert parker.park("e2", make_entry("t2"), 60.0) is Park.KEPT
    assert store.parks == 2
    assert parker.counts["parked"] == 0 and parker.counts["park_errors"] == 0
    assert not parker.down  # the store answers; only its replicas do not
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "replicas do not acknowledge" in errors[0].getMessage()
    clock.now += REPLICA_RETRY
    store.ok = True
    assert parker.park("e2", make_entry("t2"), 60.0) is Park.PARKED
    assert parker.counts["parked"] == 1 and not parker.unreplicated
    assert "acknowledges parks again" in caplog.records[-1].getMessage()


SENTINEL = "sentinel://h:1;sentinel://h:2/0"
MASTER = {"master_name": "m"}


@pytest.mark.parametrize(
    ("conf", "replicas"),
    [
        ({"broker_url": "redis://h:1/0"}, 0),
        ({"broker_url": "redis+cluster://h:1"}, 0),
        ({"broker_url": "amqp://", "extras_redis_url": "redis://h:1/0",
          "extras_redis_options": {"cluster": True}}, 0),
        ({"broker_url": SENTINEL, "broker_transport_options": MASTER}, 1),
        ({"broker_url": "amqp://", "extras_redis_url": SENTINEL, "extras_redis_options": MASTER},
         1),
        ({"broker_url": SENTINEL, "extras_delay_park_replicas": 0}, 0),
        ({"broker_url": "redis://h:1/0", "extras_delay_park_replicas": 2}, 2),
        ({"broker_url": "amqp://"}, 0),  # no store at all
    ],
)  # fmt: skip
def test_parks_wait_for_one_replica_by_default_only_behind_sentinel(
    conf: dict[str, Any], replicas: int
) -> None:
    assert park_replicas(app_with(**conf)) == replicas


def test_the_store_is_made_with_the_replicas_and_the_wait_of_the_settings() -> None:
    app = app_with(broker_url="redis://h:1/0", extras_delay_park_replicas=1,
                   extras_delay_park_wait=0.5)  # fmt: skip
    store = Parker(app).store
    assert isinstance(store, RedisDelayStore)
    assert (store.replicas, store.replica_wait) == (1, 0.5)


@pytest.mark.parametrize(
    ("key", "value"),
    [("extras_delay_park_replicas", -1), ("extras_delay_park_replicas", "1"),
     ("extras_delay_park_wait", 0)],
)  # fmt: skip
def test_bad_values_are_refused_naming_the_setting(key: str, value: Any) -> None:
    from celery.exceptions import ImproperlyConfigured

    from celery_extras.settings import settings_of

    app = app_with(broker_url="redis://h:1/0")
    app.conf[key] = value
    with pytest.raises(ImproperlyConfigured, match=key):
        settings_of(app)


class DownStore:
    """A delay store that cannot be reached until :attr:`ok`; counts the parks asked."""

    def __init__(self) -> None:
        self.ok = False
        self.parks = 0

    def park(self, entry_id: str, entry: Any, delay: float) -> bool:
        self.parks += 1
        if not self.ok:
            raise redis.ConnectionError("Error 111 connecting to localhost:1. Connection refused.")
        return True


def test_parks_in_an_outage_ask_the_store_once_per_retry_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store's back-off (``extras_limit_store_retry``, shared by every user of the store
    in the process) holds parks at once instead of a failed call each."""
    clock = FakeClock()
    parker = Parker(app_with(broker_url="redis://localhost:1/0", extras_limit_store_retry=2.0),
                    clock=clock)  # fmt: skip
    store = parker._store = DownStore()  # type: ignore[assignment]
    parker.safety.refusal = lambda: None  # type: ignore[method-assign]  # no INFO to read
    caplog.set_level(logging.WARNING, "celery_extras.delay.parking")
    results = [parker.park(f"e{i}", make_entry(f"t{i}"), 60.0) for i in range(5)]
    assert results == [Park.KEPT] * 5 and store.parks == 1 and parker.counts["park_errors"] == 5
    clock.now += 1.9
    assert parker.park("e5", make_entry("t5"), 60.0) is Park.KEPT and store.parks == 1
    clock.now += 0.1
    store.ok = True
    assert parker.park("e6", make_entry("t6"), 60.0) is Park.PARKED and store.parks == 2
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" (")[0] for line in lines] == [
        "celery-extras: the store failed",  # the process' one line, naming the delay store
        "celery-extras: the store answers again after 2.0 s",
    ]
    assert "; delay store: while parking tasks.add[t0]: waiting tasks are held" in lines[0]


class LostReplyStore:
    """A delay store whose parks fail with *error* after (maybe) storing the entry."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def park(self, entry_id: str, entry: Any, delay: float) -> bool:
        raise self.error


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (redis.TimeoutError("Timeout reading from socket"), Park.IN_DOUBT),
        (redis.ConnectionError("Connection closed by server."), Park.IN_DOUBT),
        (redis.ConnectionError("Error 111 connecting to h:1. Connection refused."), Park.KEPT),
        (redis.ResponseError("ERR unknown command"), Park.KEPT),
    ],
)
def test_a_park_whose_reply_was_lost_is_in_doubt_one_never_sent_is_kept(
    error: Exception, outcome: Park
) -> None:
    """The caller of a park in doubt must neither run its copy nor publish another: the store
    may hold the entry. A refused connection, or an error the store answered with, stored
    nothing."""
    parker = Parker(app_with(broker_url="redis://localhost:1/0"), clock=FakeClock())
    parker._store = LostReplyStore(error)  # type: ignore[assignment]
    parker.safety.refusal = lambda: None  # type: ignore[method-assign]  # no INFO to read
    parked = parker.park("e1", make_entry("t1"), 5.0)
    assert parked is outcome and not parked
    assert parker.counts["park_in_doubt"] == (outcome is Park.IN_DOUBT)
