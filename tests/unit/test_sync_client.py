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


def test_a_stored_revoke_is_broadcast_with_its_mark_and_the_worker_notes_it() -> None:
    from celery.utils.collections import AttributeDict
    from celery.worker.control import Panel

    from celery_extras.sync.control import STORED_UNTIL, SYNCER_ATTR
    from celery_extras.sync.state import WorkerRevokes

    app = Celery("d", broker="memory://", set_as_current=False)
    celery_extras.install(app)
    sent: list[dict[str, object]] = []
    app.control.broadcast = lambda command, **kw: sent.append({"command": command, **kw})  # type: ignore[method-assign]
    app.control._record = lambda *a: 2_000_000_000.0  # type: ignore[method-assign]
    app.control.revoke(["a", "b"])
    (message,) = sent
    assert message["command"] == "revoke" and message["destination"] is None
    assert message["arguments"] == {
        "task_id": ["a", "b"], "terminate": False, "signal": "SIGTERM", STORED_UNTIL: 2e9
    }  # fmt: skip

    # the worker's revoke command: Celery's own, then the ids noted (stored: none waits)
    from celery.worker import state as worker_state

    revokes = WorkerRevokes(worker_state.revoked, {}, 100.0, wall_clock=lambda: 1_999_999_000.0)
    syncer = AttributeDict(revokes=revokes)
    state = AttributeDict(app=app, hostname="w@x", consumer=AttributeDict({SYNCER_ATTR: syncer}))
    worker_state.revoked.clear()
    try:
        Panel.data["revoke"](state, **message["arguments"])  # type: ignore[arg-type]
        assert "a" in worker_state.revoked and "b" in worker_state.revoked
        assert revokes.unstored_ids == {}
        Panel.data["revoke"](state, task_id=["c"])  # a plain client's broadcast
        assert revokes.unstored_ids == {"c": 1_999_999_000.0 + 100.0}
    finally:
        worker_state.revoked.clear()
