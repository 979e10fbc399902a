"""The test app: one Celery app per namespace, built the same way in pytest and in workers.

Workers run ``celery -A tests.support.proj worker``; this module builds their
app from ``EXTRAS_TEST_*`` environment variables, which :func:`worker_env`
writes from the same arguments the test process passed to :func:`make_app`.
Every queue, exchange and store key is namespaced, so tests never see each
other's messages.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

import celery_extras

from .brokers import BACKEND_URL

__all__ = ["DEFAULT_INCLUDE", "app", "make_app", "worker_env"]

DEFAULT_INCLUDE = ("tests.support.tasks",)


def make_app(
    broker: str,
    ns: str,
    conf: dict[str, Any] | None = None,
    include: tuple[str, ...] = (),
    plain: bool = False,
) -> Celery:
    """A test app on *broker* whose queues, exchanges and store keys all start with *ns*.

    *plain* leaves celery-extras out (its settings too), for side-by-side comparisons:
    ``extras_plain`` says so on purpose, or the worker of an app whose included modules declare
    policies would refuse to start (``conf={"extras_plain": False}`` keeps that refusal).
    """
    app = Celery(ns, broker=broker, backend=BACKEND_URL, include=[*DEFAULT_INCLUDE, *include])
    app.conf.update(
        task_default_queue=ns,
        task_default_exchange=ns,
        task_default_routing_key=ns,
        control_exchange=f"{ns}.ctl",
        event_exchange=f"{ns}.ev",
        broker_transport_options={  # conf's broker_transport_options are merged in
            "unacked_key": f"{ns}.unacked",
            "unacked_index_key": f"{ns}.unacked_index",
            "unacked_mutex_key": f"{ns}.unacked_mutex",
            **(conf or {}).get("broker_transport_options", {}),
        },
        broker_connection_retry_on_startup=True,
        result_expires=600,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    app.conf.update({k: v for k, v in (conf or {}).items() if k != "broker_transport_options"})
    if not plain:
        app.conf.setdefault("extras_key_prefix", ns)
        celery_extras.install(app)
    else:
        app.conf.setdefault("extras_plain", True)
    return app


def worker_env(
    broker: str,
    ns: str,
    conf: dict[str, Any] | None = None,
    include: tuple[str, ...] = (),
    plain: bool = False,
) -> dict[str, str]:
    """Environment that makes a worker process build the same app as ``make_app``."""
    return {
        "EXTRAS_TEST_BROKER": broker,
        "EXTRAS_TEST_NS": ns,
        "EXTRAS_TEST_CONF": json.dumps(conf or {}),
        "EXTRAS_TEST_INCLUDE": ",".join(include),
        "EXTRAS_TEST_PLAIN": "1" if plain else "",
    }


def _app_from_env() -> Celery:
    include = tuple(filter(None, os.environ.get("EXTRAS_TEST_INCLUDE", "").split(",")))
    return make_app(
        os.environ.get("EXTRAS_TEST_BROKER", "redis://127.0.0.1:6379/0"),
        os.environ.get("EXTRAS_TEST_NS", "extras-test"),
        json.loads(os.environ.get("EXTRAS_TEST_CONF", "{}")),
        include,
        plain=bool(os.environ.get("EXTRAS_TEST_PLAIN")),
    )


app = _app_from_env()
