"""The example app: a plain Celery app plus one ``celery_extras.install(app)`` call.

The broker comes from ``CELERY_BROKER_URL`` (``python -m example_project`` sets
it to the Redis it chose); results go to the same Redis.
"""

from __future__ import annotations

import os

from celery import Celery

import celery_extras

from .demos import DEMO_MODULES

__all__ = ["app"]

BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")

app = Celery(
    "example_project",
    broker=BROKER_URL,
    backend=os.environ.get("CELERY_RESULT_BACKEND", BROKER_URL),
    include=["example_project.tasks", *DEMO_MODULES],
)
app.conf.update(
    task_default_queue="example",
    broker_connection_retry_on_startup=True,
    result_expires=300,
    extras_key_prefix="example",
    # park every task whose ETA is more than 2 s away in the delay store (demos/herd.py)
    extras_eta_store=True,
    extras_eta_threshold=2.0,
)
celery_extras.install(app)
