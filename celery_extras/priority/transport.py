"""Ten distinct levels on the Redis broker: kombu's ``priority_steps`` set to 0-9.

kombu's Redis transport files a message in one list per *step* of its priority and its
``BRPOP`` asks the lists in step order, 0 first. Its default steps ``[0, 3, 6, 9]`` run 1
and 2 as 0, 4 and 5 as 3, 7 and 8 as 6. With ``extras_priority`` on, the app's
``broker_transport_options`` get ``priority_steps = range(10)`` (unless the user set steps
of their own), for publishers and workers alike: a message of priority ``n`` goes to list
``n`` and is fetched before every message of ``n + 1``. Every app that publishes to or
consumes from the queues must say so: a worker with the default steps never reads lists
1, 2, 4, 5, 7 and 8.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from ..settings import settings_of
from .buffer import LEVELS

__all__ = ["STEPS", "connect_priority", "distinct_levels"]

#: kombu's ``priority_steps`` with ``extras_priority`` on.
STEPS = list(range(LEVELS))


def distinct_levels(app: Celery) -> bool:
    """Set the app's Redis priority steps to 0-9 when ``extras_priority`` is on and the
    user set none; say whether the app has them."""
    if not settings_of(app)["priority"]:
        return False
    options: dict[str, Any] = dict(app.conf.broker_transport_options or {})
    if "priority_steps" not in options:
        options["priority_steps"] = list(STEPS)
        app.conf.broker_transport_options = options
    return list(options["priority_steps"]) == STEPS


def connect_priority(app: Celery) -> None:
    """Once per app: the steps set as soon as its configuration is read (and now, when it
    already is), before any connection is made (the worker's step sets them too)."""
    app.on_after_configure.connect(_configured, sender=app, weak=False)
    app.on_after_finalize.connect(_configured, sender=app, weak=False)
    if app.configured:
        distinct_levels(app)


def _configured(sender: Celery, **kwargs: Any) -> None:
    distinct_levels(sender)
