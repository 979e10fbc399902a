"""Which store client a URL and its options make: single Redis, Sentinel, Redis Cluster."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import ImproperlyConfigured

import celery_extras
from celery_extras.settings import redis_options
from celery_extras.store.client import (
    LazyCluster,
    StoreUnavailable,
    redis_client,
    store_kind,
    store_options,
)


def app_with(**conf: Any) -> Celery:
    app = Celery("t", set_as_current=False)
    app.conf.update(conf)
    celery_extras.install(app)
    return app


@pytest.mark.parametrize(
    ("url", "options", "kind"),
    [
        ("redis://h:1/0", {}, "redis"),
        ("unix:///tmp/r.sock", {}, "redis"),
        ("redis://h:1/0", {"cluster": True}, "cluster"),
        ("redis+cluster://h:1", {}, "cluster"),
        ("rediss+cluster://h:1;rediss+cluster://h:2", {}, "cluster"),
        ("sentinel://h:1;sentinel://h:2/3", {"master_name": "m"}, "sentinel"),
    ],
)
def test_store_kind(url: str, options: dict[str, Any], kind: str) -> None:
    assert store_kind(url, options) == kind


def test_sentinel_store_is_a_master_client_with_its_db_and_sentinels() -> None:
    app = app_with(
        extras_redis_url="sentinel://127.0.0.1:1;sentinel://127.0.0.1:2/3",
        extras_redis_options={"master_name": "mymaster"},
    )
    client = redis_client(app)
    assert isinstance(client, redis.Redis)
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert pool.connection_kwargs["db"] == 3
    kwargs = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(k["host"], k["port"]) for k in kwargs] == [("127.0.0.1", 1), ("127.0.0.1", 2)]


def test_sentinel_broker_gives_the_store_its_master_name() -> None:
    app = app_with(
        broker_url="sentinel://127.0.0.1:1;sentinel://127.0.0.1:2/0",
        broker_transport_options={"master_name": "from-broker", "visibility_timeout": 10},
    )
    assert store_options(app) == {"master_name": "from-broker"}
    pool = redis_client(app).connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "from-broker"


def test_store_options_win_over_the_brokers() -> None:
    app = app_with(
        broker_url="sentinel://127.0.0.1:1/0",
        broker_transport_options={"master_name": "broker"},
        extras_redis_options={"master_name": "store"},
    )
    assert store_options(app)["master_name"] == "store"


def test_broker_options_do_not_apply_to_another_store() -> None:
    app = app_with(
        broker_url="sentinel://127.0.0.1:1/0",
        broker_transport_options={"master_name": "broker"},
        extras_redis_url="sentinel://127.0.0.1:5/0",
    )
    with pytest.raises(StoreUnavailable, match="master_name"):
        redis_client(app)


def test_sentinel_without_master_name_names_the_setting() -> None:
    app = app_with(extras_redis_url="sentinel://127.0.0.1:1/0")
    with pytest.raises(StoreUnavailable, match=r"extras_redis_options = \{\"master_name\""):
        redis_client(app)


def test_cluster_store_has_its_start_up_nodes_and_database_0_only() -> None:
    app = app_with(extras_redis_url="redis+cluster://127.0.0.1:1;redis+cluster://127.0.0.1:2")
    client = redis_client(app)  # made at once: nothing is contacted yet
    assert isinstance(client, LazyCluster)
    with pytest.raises(redis.ConnectionError, match="Redis Cluster unreachable"):
        client.get("k")  # nothing listens: an outage like any other
    bad = app_with(extras_redis_url="redis+cluster://127.0.0.1:1/2")
    with pytest.raises(ImproperlyConfigured, match="database 0 only"):  # never works: config
        redis_client(bad)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"master": "m"}, "unknown option 'master'"),
        ({"master_name": ""}, r"extras_redis_options\['master_name'\]: expected a non-empty"),
        ({"sentinel_kwargs": 3}, r"\['sentinel_kwargs'\]: expected a dict"),
        ({"cluster": "yes"}, r"\['cluster'\]: expected True or False"),
    ],
)
def test_bad_options_name_the_setting(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        redis_options("extras_redis_options", options)


def test_a_forked_child_opens_its_own_client_even_with_the_lock_held() -> None:
    """A prefork pool child forked while a thread of the parent was using the store must
    neither wait for a lock no thread of its own will release nor reuse the parent's client
    (a Redis Cluster client inherited mid-call hung the first task that used it)."""
    import os
    import select
    import signal

    from celery_extras.store import client as store

    app = app_with(extras_redis_url="redis+cluster://127.0.0.1:1")
    parent = redis_client(app)
    read, write = os.pipe()
    with store._lock:  # as the sync thread would hold it, mid-call, at the fork
        pid = os.fork()
        if pid == 0:  # the child: report, and leave without running pytest's teardown
            os.close(read)
            try:
                os.write(write, b"own" if redis_client(app) is not parent else b"same")
            finally:
                os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 10.0)
        answer = os.read(read, 10) if ready else b"hung"
    finally:
        os.close(read)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert answer == b"own"
    assert redis_client(app) is parent  # the parent keeps its client


def test_the_loop_waits_the_store_timeout_once_and_background_work_longer() -> None:
    """The worker's event loop calls the store with ``extras_store_timeout`` and never tries
    a timed-out call again (it would wait twice); the mover and revoke sync have a client of
    their own, with 2 s and one retry, timeouts included."""
    from celery_extras.store.client import TIMEOUT, close_client, redis_client

    app = celery_extras.install(Celery("t", broker="redis://127.0.0.1:1/0",
                                       set_as_current=False), store_timeout=0.1)  # fmt: skip
    try:
        loop, background = redis_client(app), redis_client(app, background=True)
        assert loop is not background and loop is redis_client(app)
        for client, timeout, retried in ((loop, 0.1, False), (background, TIMEOUT, True)):
            kwargs = client.connection_pool.connection_kwargs
            assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == timeout
            errors = kwargs["retry"]._supported_errors
            assert redis.ConnectionError in errors
            assert (redis.TimeoutError in errors) is retried
    finally:
        close_client(app)


@pytest.mark.parametrize("value", [0, -1, 5.01, 1e9, float("nan"), "0.25", True, None])
def test_an_absurd_store_timeout_is_refused_by_name(value: Any) -> None:
    app = Celery("t", broker="redis://127.0.0.1:1/0", set_as_current=False)
    with pytest.raises(ImproperlyConfigured, match=r"^extras_store_timeout: expected a number "
                       r"of seconds > 0 and <= 5"):  # fmt: skip
        celery_extras.settings_of(celery_extras.install(app, store_timeout=value))


def configured(**conf: Any) -> Celery:
    """An app whose configuration is read already: ``install`` validates it at once."""
    app = Celery("t", set_as_current=False)
    app.conf.update(conf)
    app.conf.broker_url  # noqa: B018 - reading configures the app
    return app


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("foo://x", r"^extras_redis_url: expected a redis://, rediss://, unix://"),
        ("redis://127.0.0.1:notaport/0",
         r"^extras_redis_url: port 'notaport': expected a number from 1 to 65535$"),
        ("redis://127.0.0.1:70000/0", r"^extras_redis_url: port '70000': expected a number"),
        ("redis://127.0.0.1:0/0", r"^extras_redis_url: port '0': expected a number"),
        ("redis://127.0.0.1:6379/abc", r"^extras_redis_url: database 'abc': expected a number"),
        ("redis://127.0.0.1:6379/-1", r"^extras_redis_url: database '-1': expected a number"),
        ("unix:///tmp/r.sock?db=one", r"^extras_redis_url: database 'one': expected a number"),
        ("redis+cluster://127.0.0.1:1/2", r"^extras_redis_url: database '2': a Redis Cluster"),
        ("sentinel://:26379/0", r"^extras_redis_url: no host in 'sentinel://:26379/0'$"),
        ("sentinel://127.0.0.1:1/0",
         r"^extras_redis_url is a Sentinel URL: set extras_redis_options = \{'master_name'"),
    ],
)  # fmt: skip
def test_store_settings_that_can_never_work_fail_install_naming_the_setting(
    url: str, message: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        celery_extras.install(configured(extras_redis_url=url))
    with pytest.raises(ImproperlyConfigured, match=message):  # given to install itself
        celery_extras.install(configured(), redis_url=url)


def test_a_sentinel_broker_without_master_name_is_a_configuration_error() -> None:
    app = configured(broker_url="sentinel://127.0.0.1:1/0")
    with pytest.raises(ImproperlyConfigured, match=r"broker's Sentinel: set master_name in "
                       r"broker_transport_options"):  # fmt: skip
        celery_extras.install(app)


def test_store_settings_known_only_at_the_worker_start_stop_it() -> None:
    from types import SimpleNamespace

    from celery_extras.install import ExtrasStep

    app = app_with()  # installed before its configuration is read
    app.conf.update(broker_url="memory://", extras_redis_url="sentinel://127.0.0.1:1/0")
    parent = SimpleNamespace(app=app, pool_cls=None, concurrency=1)
    with pytest.raises(ImproperlyConfigured, match=r"^extras_redis_url is a Sentinel URL"):
        ExtrasStep(parent)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/99", "redis://", "redis://[::1]:6379/0", "unix:///tmp/r.sock?db=3",
     "rediss://user:p%40ss@h:6380/2", "redis+cluster://127.0.0.1:1;redis+cluster://127.0.0.1:2"],
)  # fmt: skip
def test_store_urls_that_may_work_are_taken(url: str) -> None:
    """A database above the server's count (16 by default, its ``databases``) is known only
    to the server: a URL cannot tell, and Redis refuses it at the first connection."""
    app = celery_extras.install(configured(extras_redis_url=url))
    assert celery_extras.settings_of(app)["redis_url"] == url
