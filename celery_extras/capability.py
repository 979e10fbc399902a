"""What a capability of celery-extras hands to ``install(app)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Celery, bootsteps

from .settings import Setting

__all__ = ["Capability"]


@dataclass(frozen=True)
class Capability:
    """One feature of celery-extras: its settings, its bootsteps, and a hook for the rest.

    ``connect(app)`` runs once per app, for what cannot be a bootstep: signal
    handlers, control commands, client-side wrappers. Steps are added to the
    app's ``worker`` and ``consumer`` blueprints.
    """

    name: str
    settings: tuple[Setting[Any], ...] = ()
    worker_steps: tuple[type[bootsteps.Step], ...] = ()
    consumer_steps: tuple[type[bootsteps.Step], ...] = ()
    connect: Callable[[Celery], None] | None = None
