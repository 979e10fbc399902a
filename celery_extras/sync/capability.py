"""The sync capability as ``install(app)`` wires it: settings, bootsteps, hooks."""

from __future__ import annotations

from celery import Celery

from ..capability import Capability
from ..compat import REVOKE_EXPIRES, REVOKES_MAX
from ..settings import Setting, boolean, number
from .step import NoMingle, SyncStep

__all__ = ["SYNC"]


def _connect(app: Celery) -> None:
    from . import control  # noqa: F401  (registers the extras_sync_hello/extras_revoked commands)
    from .client import install_client

    install_client(app)


SYNC = Capability(
    name="sync",
    settings=(
        Setting(
            "sync_enabled",
            True,
            boolean,
            "bool",
            "Durable, continuously synced revokes and Lamport clock. When on, Celery's Mingle "
            "is turned off (this replaces it) and ``app.control.revoke`` / "
            "``revoke_by_stamped_headers`` also write the store.",
        ),
        Setting(
            "sync_interval",
            2.0,
            number(above=0),
            "float",
            "Seconds between two anti-entropy rounds of a worker: it compares the store's "
            "version with its own, pulls only the changes, and stores the revokes it learnt "
            "from a broadcast alone. A worker that missed a broadcast converges within two.",
        ),
        Setting(
            "revoke_expires",
            REVOKE_EXPIRES,
            number(above=0),
            "float",
            "Seconds a revoke is kept in the store (and honoured by workers that start "
            "later), unless the revoke gives its own (``revoke_expires=`` keyword of "
            "``app.control.revoke``). Default: Celery's ``CELERY_WORKER_REVOKE_EXPIRES``.",
        ),
        Setting(
            "revoke_max",
            REVOKES_MAX,
            number(minimum=1, integer=True),
            "int",
            "Most revoked ids (and, separately, stamps) the store keeps; beyond it the "
            "soonest-expiring are evicted. Default: Celery's ``CELERY_WORKER_REVOKES_MAX``.",
        ),
        Setting(
            "sync_reply_max",
            10000,
            number(minimum=0, integer=True),
            "int",
            "Most revoked ids (and stamps) a worker sends to, or accepts from, a starting "
            "neighbour in reply to its hello (the store holds the rest).",
        ),
        Setting(
            "sync_hello_timeout",
            1.0,
            number(above=0),
            "float",
            "Seconds the sync thread of a starting worker collects neighbours' replies "
            "(merged as they arrive; the worker is ready meanwhile).",
        ),
    ),
    worker_steps=(NoMingle,),
    consumer_steps=(SyncStep,),
    connect=_connect,
)
