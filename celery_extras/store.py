"""The shared Redis store: which Redis, and one client per app.

Durable revokes, global token buckets and per-item failure counts live here.
The store is ``extras_redis_url`` when set, else the broker when it is Redis,
else the result backend when it is Redis; with none of them it is absent, and
each feature that needs it says so when the worker starts.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import redis
from celery import Celery

__all__ = ["StoreUnavailable", "redis_client", "store_key", "store_url"]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_clients: weakref.WeakKeyDictionary[Celery, redis.Redis] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class StoreUnavailable(RuntimeError):
    """No Redis is configured for the shared store."""


def _as_redis_url(url: Any) -> str | None:
    if not isinstance(url, str):
        return None
    if url.startswith(("redis+socket://", "socket://")):  # kombu's unix-socket spelling
        return "unix://" + url.split("://", 1)[1]
    return url if url.startswith(_REDIS_SCHEMES) else None


def store_url(app: Celery) -> str | None:
    """The URL of the store's Redis, or ``None`` when the app has no Redis at all."""
    configured: str | None = app.conf.get("extras_redis_url")
    if configured:
        return configured
    broker = app.conf.broker_url
    first_broker = broker[0] if isinstance(broker, list | tuple) and broker else broker
    if isinstance(first_broker, str):
        first_broker = first_broker.split(";")[0]
    return _as_redis_url(first_broker) or _as_redis_url(app.conf.result_backend)


def redis_client(app: Celery) -> redis.Redis:
    """The app's store client (one per app, thread-safe, short socket timeouts)."""
    with _lock:
        client = _clients.get(app)
        if client is None:
            url = store_url(app)
            if url is None:
                raise StoreUnavailable(
                    "celery-extras needs a Redis store: set extras_redis_url "
                    "(the broker and result backend are not Redis)"
                )
            client = redis.Redis.from_url(
                url,
                socket_timeout=2.0,
                socket_connect_timeout=2.0,
                health_check_interval=30,
                decode_responses=True,
            )
            _clients[app] = client
        return client


def store_key(app: Celery, *parts: str) -> str:
    """A key of the store under the app's ``extras_key_prefix``."""
    prefix = app.conf.get("extras_key_prefix") or "celery-extras"
    return ":".join((prefix, *parts))
