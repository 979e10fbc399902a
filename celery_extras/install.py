"""``install(app)``: wire every capability of celery-extras into a Celery app, once.

Each capability (sync, policies, consumer, stats) is described by a
:class:`~celery_extras.capability.Capability`; ``install`` adds their settings,
bootsteps and hooks to the app. Calling it again only re-applies options.
"""

from __future__ import annotations

import difflib
import functools
import logging
import weakref
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from typing import Any

from celery import Celery, bootsteps
from celery.exceptions import ImproperlyConfigured

from .admission.capability import admission_capability
from .capability import Capability
from .compat import check_worker
from .consumer.capability import CONSUMER
from .delay.capability import DELAY
from .policies import POLICIES
from .priority.capability import PRIORITY
from .settings import (
    CORE_SETTINGS,
    PREFIX,
    Setting,
    conf_key,
    declare,
    deprecated_name,
    settings_of,
)
from .stats.capability import STATS
from .store.client import StoreStep, check_store
from .sync.capability import SYNC
from .workarounds import (
    EventLoopGuard,
    EventsCloseGuard,
    PoolFlushGuard,
    PrefetchRestoreGuard,
    RedisCloseGuard,
    RedisRestoreGuard,
)

__all__ = [
    "CAPABILITIES",
    "Capability",
    "ExtrasStep",
    "all_settings",
    "green_pool_acks",
    "install",
    "settings_of",
]


CAPABILITIES: tuple[Capability, ...] = (
    SYNC,
    admission_capability(POLICIES),
    DELAY,
    CONSUMER,
    PRIORITY,
    STATS,
)

_installed: weakref.WeakSet[Celery] = weakref.WeakSet()

logger = logging.getLogger(__name__)


def all_settings() -> Iterator[Setting[Any]]:
    """Every ``extras_*`` setting: the core ones, then each capability's."""
    yield from CORE_SETTINGS
    for capability in CAPABILITIES:
        yield from capability.settings


@functools.cache
def _version() -> str:
    try:
        return distribution_version("celery-extras")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


class ExtrasStep(bootsteps.StartStopStep):
    """Worker step that validates the settings at boot and reports what is installed."""

    label = "celery-extras"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        check_worker()  # fail the worker start naming the Celery version and the feature
        settings_of(parent.app)  # fail the worker start with a message naming the setting
        check_store(parent.app)  # a store that can never work too (a Sentinel without master)
        warning = green_pool_acks(parent.app, parent.pool_cls, parent.concurrency)
        if warning:
            logger.warning("celery-extras: %s", warning)

    def info(self, parent: Any) -> dict[str, Any]:
        return {
            "extras_install": {
                "version": _version(),
                "capabilities": [c.name for c in CAPABILITIES],
            }
        }


def green_pool_acks(app: Celery, pool_cls: Any, concurrency: Any) -> str | None:
    """Why acks may be refused, or ``None``: a green pool (gevent, eventlet) running more
    tasks at once than ``broker_pool_limit`` connections, on a Redis broker with
    ``acks_late`` tasks. Tasks that end together then ask the pool for more connections than
    it has; kombu refuses the ack (``MaxConnectionsError``) and the message runs again."""
    limit = app.conf.broker_pool_limit
    if not getattr(pool_cls, "is_green", False) or not limit or not isinstance(concurrency, int):
        return None
    if concurrency <= limit:
        return None
    with app.connection_for_write() as connection:  # not connected: its transport's kind
        if connection.transport.driver_type != "redis":
            return None
    late = [name for name, task in sorted(app.tasks.items()) if getattr(task, "acks_late", False)]
    if not late:
        return None
    return (
        f"-P {getattr(pool_cls, '__module__', 'green').rsplit('.', 1)[-1]} runs {concurrency} "
        f"tasks at once over broker_pool_limit={limit} connections on a Redis broker, and "
        f"{len(late)} task(s) ack late (e.g. {late[0]}): acks refused when they end together "
        f"(MaxConnectionsError) make their messages run twice. Set broker_pool_limit to at "
        f"least {concurrency}"
    )


def install(app: Celery, **options: Any) -> Celery:
    """Add celery-extras to *app* and return it; safe to call more than once.

    *options* are settings without their prefix (``stats_interval=1`` sets
    ``extras_stats_interval``) and override what ``app.conf`` holds.
    """
    declared = tuple(all_settings())
    by_name = {name: s for s in declared for name in (s.name, *s.formerly)}
    for name in options:
        if name not in by_name:
            close = difflib.get_close_matches(name, [s.name for s in declared], n=1)
            hint = f"; did you mean {PREFIX}{close[0]}? ({close[0]}=...)" if close else ""
            raise ImproperlyConfigured(f"{PREFIX}{name}: unknown celery-extras setting{hint}")
        if name != by_name[name].name:
            deprecated_name(PREFIX + name, by_name[name])
    declare(app, declared)
    if options:  # under the name the app reads first (CELERY_EXTRAS_* in a Django namespace)
        app.conf.update({conf_key(by_name[n], app.namespace): v for n, v in options.items()})

    if app in _installed:
        if app.configured:
            _validate(app)
        return app
    _installed.add(app)

    app.steps["worker"].add(ExtrasStep)
    app.steps["worker"].add(PoolFlushGuard)
    app.steps["worker"].add(EventLoopGuard)
    app.steps["consumer"].add(RedisCloseGuard)
    app.steps["consumer"].add(RedisRestoreGuard)
    app.steps["consumer"].add(PrefetchRestoreGuard)
    app.steps["consumer"].add(EventsCloseGuard)
    app.steps["consumer"].add(StoreStep)
    for capability in CAPABILITIES:
        for step in capability.worker_steps:
            app.steps["worker"].add(step)
        for step in capability.consumer_steps:
            app.steps["consumer"].add(step)
        if capability.connect is not None:
            capability.connect(app)

    if app.configured:
        _validate(app)
    else:
        app.on_after_configure.connect(_validate_after_configure, sender=app, weak=False)
    return app


def _validate(app: Celery) -> None:
    """Fail naming the setting: a bad value, or store settings that can never work."""
    settings_of(app)
    check_store(app)


def _validate_after_configure(sender: Celery, **kwargs: Any) -> None:
    _validate(sender)
