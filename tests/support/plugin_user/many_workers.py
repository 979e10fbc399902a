"""Run by tests/integration/test_testing_plugin.py as ``test_many_workers.py``, outside the
repository: twenty extras_workers one after another, then nothing of them left."""

import logging
import threading

import pytest
from celery import shared_task

from celery_extras import concurrency, limit
from celery_extras.store.client import CLIENT_NAME

THREADS_BEFORE = {t.ident for t in threading.enumerate()}


@limit("1/s")
@concurrency(2)
@shared_task
def tick(i):
    return i


@pytest.mark.parametrize("n", range(20))
def test_a_worker(extras_worker, extras_clock, n):
    results = [tick.delay(i) for i in range(3)]
    extras_clock.advance(2)
    assert [r.get(timeout=10) for r in results] == [0, 1, 2]


def test_nothing_of_them_is_left(extras_store):
    left = [t.name for t in threading.enumerate() if t.ident not in THREADS_BEFORE]
    assert left == []
    ours = [c for c in extras_store.client.client_list() if c["name"] == CLIENT_NAME]
    assert ours == []


def test_logging_is_as_before_the_workers(caplog):
    """Each worker set logging up as a worker does; each gave it back."""
    logging.getLogger("celery_extras.limits.gate").warning("still heard")
    assert [r.getMessage() for r in caplog.records] == ["still heard"]
