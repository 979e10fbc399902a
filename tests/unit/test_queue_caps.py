"""``extras_queue_concurrency``: what it accepts, and loud errors naming the setting."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured

import celery_extras
from celery_extras.concurrency.queue_caps import queue_caps
from celery_extras.settings import settings_of


def test_an_int_is_a_worker_cap_and_a_dict_may_be_global() -> None:
    caps = queue_caps("k", {"slow": 1, "reports": {"limit": 10, "scope": "global", "lease": 5}})
    assert {q: (s.n, s.scope, s.lease) for q, s in caps.items()} == {
        "slow": (1, "worker", 30.0),
        "reports": (10, "global", 5.0),
    }
    assert queue_caps("k", {}) == {} and queue_caps("k", None) == {}


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"slow": 0}, "extras_queue_concurrency['slow']: n 0: expected an int from 1"),
        ({"slow": "1"}, "extras_queue_concurrency['slow']"),
        ({"slow": {"limit": 2, "scope": "cluster"}}, "scope 'cluster'"),
        ({"slow": {"limt": 2}}, "extras_queue_concurrency['slow']: unknown key(s) ['limt']"),
        ({"slow": {"scope": "global"}}, "extras_queue_concurrency['slow']: no 'limit'"),
        ([("slow", 1)], "extras_queue_concurrency: expected a dict of queue names"),
        ({"": 1}, "extras_queue_concurrency: expected a dict of queue names"),
    ],
)
def test_a_bad_value_fails_naming_the_setting_and_the_queue(value: Any, said: str) -> None:
    app = Celery("caps", broker="memory://", set_as_current=False)
    app.conf.extras_queue_concurrency = value
    celery_extras.install(app)
    with pytest.raises(ImproperlyConfigured) as failed:
        settings_of(app)
    assert said in str(failed.value)


def test_the_setting_reads_in_full() -> None:
    app = Celery("caps", broker="memory://", set_as_current=False)
    app.conf.extras_queue_concurrency = {"slow": 1}
    celery_extras.install(app)
    assert settings_of(app)["queue_concurrency"] == {
        "slow": {"limit": 1, "scope": "worker", "lease": 30.0}
    }
