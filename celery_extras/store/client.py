"""The shared Redis store: which Redis, and one client per app.

Durable revokes, global token buckets and per-item failure counts live here.
The store is ``extras_redis_url`` when set, else the broker when it is Redis,
else the result backend when it is Redis; with none of them it is absent, and
each feature that needs it says so when the worker starts.

Three kinds of store, by URL:

* a single Redis: ``redis://``, ``rediss://``, ``unix://``;
* Redis behind Sentinel: ``sentinel://host:port;sentinel://host:port/db``, with
  ``extras_redis_options = {"master_name": ...}`` (when the store is the broker,
  Celery's ``broker_transport_options`` give ``master_name`` and
  ``sentinel_kwargs``, as they do for the broker); the client asks the Sentinels
  for the master and asks again after a failover;
* a Redis Cluster: ``redis+cluster://host:port`` (``rediss+cluster://`` for TLS;
  several start-up nodes separated by ``;``), or any ``redis://`` URL with
  ``extras_redis_options = {"cluster": True}``; the client follows ``MOVED`` and
  ``ASK`` redirections and re-reads the slot map.

Every script of the package touches keys of one hash slot only (see the docs'
"Store topologies"), so all three run the same code. :func:`redis_client` is the
one way the package gets its client.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TypeAlias, cast
from urllib.parse import unquote, urlsplit

import redis
from celery import Celery, bootsteps
from celery.exceptions import ImproperlyConfigured
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode
from redis.commands.core import Script
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from .. import clock as clocks
from ..settings import (
    KEY_PREFIX,
    REDIS_OPTIONS,
    REDIS_URL,
    STORE_ALLOW_EVICTION,
    STORE_RETRY,
    STORE_TIMEOUT,
    settings_of,
)
from .health import StoreHealth, StoreUnavailable, StoreUser
from .safety import REFRESH, StoreSafety

__all__ = [
    "CLIENT_NAME",
    "LazyCluster",
    "StoreClient",
    "StoreStep",
    "StoreUnavailable",
    "check_store",
    "close_client",
    "connect",
    "forget_after_fork",
    "redis_client",
    "store_health",
    "store_key",
    "store_kind",
    "store_options",
    "store_safety",
    "store_url",
    "store_user",
]

#: The client of the store: a ``redis.Redis`` (single or Sentinel-managed) or a ``RedisCluster``.
StoreClient: TypeAlias = "redis.Redis | redis.RedisCluster"

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
_SENTINEL_SCHEME = "sentinel://"
#: Socket timeouts of the store's connections for background work (the delay mover, revoke
#: sync, command-line tools), seconds; the worker's loop has ``extras_store_timeout``.
TIMEOUT = 2.0
#: The name every store connection gives itself (``CLIENT SETNAME``): ``CLIENT LIST``
#: tells celery-extras' connections from the broker's and the result backend's.
CLIENT_NAME = "celery-extras"

logger = logging.getLogger(__name__)

_clients: weakref.WeakKeyDictionary[Celery, StoreClient] = weakref.WeakKeyDictionary()
_background: weakref.WeakKeyDictionary[Celery, StoreClient] = weakref.WeakKeyDictionary()
_safety: weakref.WeakKeyDictionary[Celery, StoreSafety] = weakref.WeakKeyDictionary()
_health: weakref.WeakKeyDictionary[Celery, StoreHealth] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
#: Caches holding store clients (or objects bound to one), emptied in a forked child.
_per_process: list[MutableMapping[Any, Any]] = [_clients, _background, _safety, _health]


def forget_after_fork(*caches: MutableMapping[Any, Any]) -> None:
    """Empty *caches* (of objects holding a store client) in every forked child process."""
    _per_process.extend(caches)


def _after_fork_in_child() -> None:
    """A forked process (a prefork pool child) opens store clients of its own.

    The ones it inherited may have been mid-call in a thread of the parent (the sync
    thread, a delay mover), holding locks no thread here will ever release: a Redis
    Cluster client then hung the first task that used it.
    """
    global _lock
    _lock = threading.Lock()
    for cache in _per_process:
        cache.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _as_redis_url(url: Any) -> str | None:
    if not isinstance(url, str):
        return None
    if url.startswith(("redis+socket://", "socket://")):  # kombu's unix-socket spelling
        return "unix://" + url.split("://", 1)[1]
    if url.startswith((*_REDIS_SCHEMES, *_CLUSTER_SCHEMES, _SENTINEL_SCHEME)):
        return url
    return None


def _broker_url(app: Celery) -> str | None:
    broker = app.conf.broker_url
    first = broker[0] if isinstance(broker, list | tuple) and broker else broker
    if not isinstance(first, str):
        return None
    if first.startswith(_SENTINEL_SCHEME):
        return first  # sentinel://a;sentinel://b is one broker, its Sentinels listed
    return first.split(";")[0]


def _store_is_broker(app: Celery) -> bool:
    return not settings_of(app)[REDIS_URL] and _as_redis_url(_broker_url(app)) is not None


def store_url(app: Celery) -> str | None:
    """The URL of the store's Redis, or ``None`` when the app has no Redis at all."""
    configured = settings_of(app)[REDIS_URL]
    if configured:
        return configured
    return _as_redis_url(_broker_url(app)) or _as_redis_url(app.conf.result_backend)


def store_options(app: Celery) -> dict[str, Any]:
    """``extras_redis_options`` over, when the store is the broker, the broker's
    ``broker_transport_options`` for ``master_name`` and ``sentinel_kwargs``."""
    options: dict[str, Any] = {}
    if _store_is_broker(app):
        transport = app.conf.broker_transport_options or {}
        options.update(
            {k: transport[k] for k in ("master_name", "sentinel_kwargs") if k in transport}
        )
    configured: dict[str, Any] = settings_of(app)[REDIS_OPTIONS]
    options.update(configured)
    return options


def store_kind(url: str, options: Mapping[str, Any]) -> str:
    """``"cluster"``, ``"sentinel"`` or ``"redis"``: how the store at *url* is reached."""
    if url.startswith(_CLUSTER_SCHEMES) or (
        url.startswith(_REDIS_SCHEMES) and options.get("cluster")
    ):
        return "cluster"
    if url.startswith(_SENTINEL_SCHEME):
        return "sentinel"
    return "redis"


def check_store(app: Celery) -> None:
    """Fail with :class:`ImproperlyConfigured` naming the setting where the store's settings
    can never work together (a Sentinel URL with no master's name); the URL itself is checked
    with its setting. Only a store that does not answer is an outage."""
    url = store_url(app)
    if url is None:
        return
    options = store_options(app)
    if store_kind(url, options) != "sentinel" or options.get("master_name"):
        return
    if settings_of(app)[REDIS_URL]:
        raise ImproperlyConfigured(
            f"{REDIS_URL.key} is a Sentinel URL: set {REDIS_OPTIONS.key} = "
            "{'master_name': ...}, the name of the master its Sentinels watch"
        )
    raise ImproperlyConfigured(
        "the celery-extras store is the broker's Sentinel: set master_name in "
        f"broker_transport_options (or {REDIS_OPTIONS.key} = {{'master_name': ...}})"
    )


def _retry(timeouts: bool) -> Retry:
    """One quick retry on a lost connection (a failover, a restart): a call in flight goes
    to the new master; longer outages fall to each feature's own outage behaviour. A call
    that timed out is tried again only where *timeouts* (not on the worker's loop, which
    must not wait twice)."""
    errors: tuple[type[Exception], ...] = (redis.ConnectionError,)
    if timeouts:
        errors += (redis.TimeoutError, socket.timeout)
    return Retry(ExponentialBackoff(cap=0.2, base=0.05), retries=1, supported_errors=errors)


#: Called after each new connection of a store client is made (a reconnect, a failover).
OnConnect: TypeAlias = "Callable[[], None] | None"


def _common(timeout: float = TIMEOUT, loop: bool = False) -> dict[str, Any]:
    """The options of every store connection: *timeout* for its sockets, and a timed-out
    call retried once unless it is made on the worker's *loop*."""
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "client_name": CLIENT_NAME,
        "decode_responses": True,
        "retry": _retry(timeouts=not loop),
    }


def connect(
    url: str,
    options: Mapping[str, Any],
    on_connect: OnConnect = None,
    timeout: float = TIMEOUT,
    loop: bool = False,
) -> StoreClient:
    """A new client for the store at *url*; :class:`ValueError` naming what is wrong.

    *on_connect* is called after every new connection the client makes; *timeout* and
    *loop* are its connections' (see :func:`_common`).
    """
    common = _common(timeout, loop)
    kind = store_kind(url, options)
    if kind == "cluster":
        return _cluster(url, common, on_connect)
    if kind == "sentinel":
        return _sentinel(url, options, common, on_connect)
    return redis.Redis.from_url(url, health_check_interval=30, **common, **_hook(on_connect))


def _hook(on_connect: OnConnect) -> dict[str, Any]:
    """The option calling *on_connect* after each new connection is set up."""
    if on_connect is None:
        return {}

    def connected(connection: Any) -> None:
        connection.on_connect()  # what redis-py does when given no hook
        on_connect()

    return {"redis_connect_func": connected}


def _cluster(url: str, common: dict[str, Any], on_connect: OnConnect = None) -> redis.RedisCluster:
    parts = [p for p in url.split(";") if p]
    nodes = []
    for part in parts:
        split = urlsplit(part)
        if not split.hostname:
            raise ValueError(f"store URL {url!r}: no host in {part!r}")
        nodes.append((split.hostname, split.port or 6379))
    first = urlsplit(parts[0])
    if first.path.strip("/") not in ("", "0"):
        raise ValueError(f"store URL {url!r}: a Redis Cluster has database 0 only")
    kwargs = dict(common)  # the cluster client retries MOVED/ASK itself
    if on_connect is not None:  # called after the cluster client's own on_connect
        kwargs["redis_connect_func"] = lambda connection: on_connect()
    if first.password:
        kwargs["password"] = unquote(first.password)
    if first.username:
        kwargs["username"] = unquote(first.username)
    if first.scheme.startswith("rediss"):
        kwargs["ssl"] = True
    return cast("redis.RedisCluster", LazyCluster(nodes, kwargs))


class _Utf8:
    """What :class:`redis.commands.core.Script` asks of a client's encoder."""

    def encode(self, value: str) -> bytes:
        return value.encode("utf-8")


class LazyCluster:
    """A ``RedisCluster`` made on first use, and made again after a failed first use.

    ``RedisCluster()`` reads the slot map when it is created and raises when no node
    answers; a store that is down when the worker starts must instead behave as any
    store outage (a :class:`redis.ConnectionError` on use, then recovery), so the
    client is built on the first call, and errors of the cluster client that are not
    :class:`redis.RedisError` (no node reachable) are raised as connection errors.
    """

    def __init__(self, nodes: list[tuple[str, int]], kwargs: dict[str, Any]) -> None:
        self._nodes = nodes
        self._kwargs = kwargs
        self._client: redis.RedisCluster | None = None
        self._lock = threading.Lock()

    def _get(self) -> redis.RedisCluster:
        with self._lock:
            if self._client is None:
                nodes = [ClusterNode(h, p) for h, p in self._nodes]  # type: ignore[no-untyped-call]
                try:
                    self._client = redis.RedisCluster(startup_nodes=nodes, **self._kwargs)
                except RedisClusterException as exc:
                    raise redis.ConnectionError(f"Redis Cluster unreachable: {exc}") from exc
            return self._client

    def close(self) -> None:
        """Close the cluster client's connections, if it was ever made."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def get_encoder(self) -> _Utf8:
        return _Utf8()

    def register_script(self, script: str) -> Script:
        return Script(self, script)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._get(), name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except RedisClusterException as exc:
                raise redis.ConnectionError(f"Redis Cluster: {exc}") from exc

        return call


def _sentinel(
    url: str, options: Mapping[str, Any], common: dict[str, Any], on_connect: OnConnect = None
) -> redis.Redis:
    master_name = options.get("master_name")
    if not isinstance(master_name, str) or not master_name:
        raise ValueError(
            f"store URL {url!r} is a Sentinel URL: set extras_redis_options = "
            '{"master_name": ...} (or master_name in broker_transport_options when the '
            "store is the broker)"
        )
    sentinels, db, extra = [], 0, {}
    for part in (p for p in url.split(";") if p):
        split = urlsplit(part)
        if not split.hostname:
            raise ValueError(f"store URL {url!r}: no host in {part!r}")
        sentinels.append((split.hostname, split.port or 26379))
        if split.path.strip("/"):
            try:
                db = int(split.path.strip("/"))
            except ValueError:
                raise ValueError(
                    f"store URL {url!r}: database {split.path!r} is not a number"
                ) from None
        if split.password:
            extra["password"] = unquote(split.password)
        if split.username:
            extra["username"] = unquote(split.username)
    sentinel_kwargs = options.get("sentinel_kwargs") or {}
    if not isinstance(sentinel_kwargs, dict):
        raise ValueError(
            f"extras_redis_options sentinel_kwargs {sentinel_kwargs!r}: expected a dict"
        )
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        sentinels,
        sentinel_kwargs={
            "socket_timeout": common["socket_timeout"],
            "socket_connect_timeout": common["socket_connect_timeout"],
            **sentinel_kwargs,
        },
        **common,
    )
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        master_name, db=db, **extra, **common, **_hook(on_connect)
    )
    return master


def redis_client(app: Celery, background: bool = False) -> StoreClient:
    """The app's store client (one per app and process, thread-safe).

    The worker's event loop calls through it: its calls wait ``extras_store_timeout`` at
    most and a timeout is not retried. *background* work (the delay mover, revoke sync,
    the command line) has a client of its own, with longer timeouts (:data:`TIMEOUT`).
    A ``redis.Redis`` (single, or managed by Sentinel) or a ``redis.RedisCluster``;
    :class:`StoreUnavailable` when there is no store or its settings are wrong.
    """
    clients = _background if background else _clients
    with _lock:
        client = clients.get(app)
        if client is None:
            url = store_url(app)
            if url is None:
                raise StoreUnavailable(
                    "celery-extras needs a Redis store: set extras_redis_url "
                    "(the broker and result backend are not Redis)"
                )
            ref = weakref.ref(app)

            def reconnected() -> None:  # the next park reads the eviction policy again
                owner = ref()
                safety = _safety.get(owner) if owner is not None else None
                if safety is not None:
                    safety.stale()

            loop_timeout = settings_of(app)[STORE_TIMEOUT]
            timeout = max(TIMEOUT, loop_timeout) if background else loop_timeout
            try:
                client = connect(url, store_options(app), reconnected, timeout, not background)
            except ValueError as exc:
                raise StoreUnavailable(str(exc)) from None
            clients[app] = client
        return client


def store_safety(app: Celery) -> StoreSafety:
    """The app's :class:`~.store_safety.StoreSafety` in this process (logging nothing until
    a worker step gives it a logger, so pool processes do not repeat the worker's lines)."""
    health = store_health(app)
    with _lock:
        safety = _safety.get(app)
        if safety is None:
            ref = weakref.ref(app)

            def client() -> StoreClient:
                owner = ref()
                if owner is None:
                    raise StoreUnavailable("the app of this store is gone")
                return redis_client(owner)

            allow = settings_of(app)[STORE_ALLOW_EVICTION]
            safety = _safety[app] = StoreSafety(client, allow_eviction=allow, health=health)
        return safety


def store_health(app: Celery) -> StoreHealth:
    """The app's :class:`~.store_health.StoreHealth` in this process: whether its store
    answers, shared by every user of the store (a pool process has its own)."""
    with _lock:
        health = _health.get(app)
        if health is None:
            retry = float(settings_of(app)[STORE_RETRY])
            health = _health[app] = StoreHealth(retry)
        return health


def store_user(
    app: Celery,
    logger: logging.Logger,
    what: str,
    consequence: str,
    clock: Callable[[], float] = time.monotonic,
) -> StoreUser:
    """*what*'s view of the app's :func:`store_health` (on another *clock*, a test's, a
    health of its own). Outages are timed in real time, simulated or not."""
    if clock in (time.monotonic, clocks.monotonic):
        health = store_health(app)
    else:
        health = StoreHealth(float(settings_of(app)[STORE_RETRY]), clock)
    return health.user(logger, what, consequence)


def close_client(app: Celery) -> None:
    """Close the app's store client, if it has one (a worker stopping): its connections are
    closed now rather than when the app is collected; the next :func:`redis_client` call
    opens a new one."""
    with _lock:
        clients = [c for c in (_clients.pop(app, None), _background.pop(app, None)) if c]
    for client in clients:
        with contextlib.suppress(redis.RedisError, OSError):  # a broken one: nothing to keep
            client.close()


def store_key(app: Celery, *parts: str) -> str:
    """A key of the store under the app's ``extras_key_prefix``."""
    return ":".join((settings_of(app)[KEY_PREFIX], *parts))


class StoreStep(bootsteps.StartStopStep):
    """Consumer step owning the worker's view of its store: the store's eviction policy is
    read (and a risk logged) at start, after every reconnect and every
    :data:`~.store_safety.REFRESH` seconds, and the store's connections are closed when the
    worker shuts down. Every consumer step that uses the store requires it, so it starts
    before them and shuts down after them."""

    label = "extras-store"
    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.safety: StoreSafety | None = None
        self.tref: Any = None
        if store_url(c.app) is not None:
            self.safety = store_safety(c.app)
            self.safety.logger = logger  # the worker's main process says it, once

    def start(self, c: Any) -> None:
        if self.safety is None:
            return
        self.safety.stale()  # a reconnect may reach another Redis
        self.safety.current()
        self.tref = c.timer.call_repeatedly(REFRESH, self.safety.current, priority=10)

    def stop(self, c: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        close_client(c.app)

    def info(self, c: Any) -> dict[str, Any]:
        return {"extras_store": self.safety.info()} if self.safety is not None else {}
