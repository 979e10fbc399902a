"""Retry waits while the failure memory's store is away grow with ``request.retries``.

Before, every retry fell back to the policy's first wait (0.21, 0.21, 0.21 s for
``ExponentialBackoff(0.2, 5)``; with ``base=0.005`` a retry every 5 ms for as long as
Redis is down).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery

from celery_extras import ExponentialBackoff, install
from celery_extras.retries.hook import _countdown
from celery_extras.retries.spec import RetrySpec


def test_waits_back_off_on_request_retries_while_the_store_is_down() -> None:
    app = install(Celery("unit-retry-outage", broker="memory://", set_as_current=False))
    app.conf.extras_redis_url = "redis://127.0.0.1:1/0"  # nothing listens there
    spec = RetrySpec(on=(ValueError,), policy=ExponentialBackoff(0.2, 5), max_retries=None,
                     per_item=False, key=None)  # fmt: skip
    waits = []
    for retries in range(6):
        task = SimpleNamespace(app=app, name="t", request=SimpleNamespace(retries=retries))
        waits.append(_countdown(task, spec, "item"))  # type: ignore[arg-type]
    assert waits == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0])
