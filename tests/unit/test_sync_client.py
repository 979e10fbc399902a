"""Client side: which Control class an installed app gets, and how stamped headers are read."""

from __future__ import annotations

import pytest
from celery import Celery
from celery.app.control import Control

import celery_extras
from celery_extras.sync.client import DurableRevokes, _stamps_of, record_revokes


class CustomControl(Control):
    pass


def test_control_is_durable_whether_created_before_or_after_install() -> None:
    before = Celery("a", broker="memory://", set_as_current=False)
    created = before.control
    celery_extras.install(before)
    assert before.control is created and isinstance(created, DurableRevokes)

    after = Celery("b", broker="memory://", set_as_current=False, control=CustomControl)
    celery_extras.install(after)
    assert isinstance(after.control, DurableRevokes) and isinstance(after.control, CustomControl)


def test_stamped_headers_in_both_of_celerys_shapes() -> None:
    assert _stamps_of({"batch": ["b1", "b2"], "tenant": "t"}) == [
        ("batch", "b1"),
        ("batch", "b2"),
        ("tenant", "t"),
    ]
    assert _stamps_of(["batch=b1", "tenant=t=x", "junk"]) == [("batch", "b1"), ("tenant", "t")]
    assert _stamps_of(42) == []


def test_invalid_revokes_are_refused_by_name_before_any_write() -> None:
    app = Celery("c", broker="memory://", set_as_current=False)
    celery_extras.install(app, redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match=r"cannot store revokes of 'xxx.*, 7"):
        record_revokes(app, ["x" * 300, 7])
    with pytest.raises(ValueError, match="revoke expires -1"):
        record_revokes(app, ["fine"], expires=-1)
