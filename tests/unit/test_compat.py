"""Every private Celery/kombu attribute celery-extras uses: present, with the shape relied on.

The first Celery or kombu release that moves one fails here, not in production. An
attribute a supported release lacks (``since``) must be absent only below that release,
and then its fallback must behave as that release does.
"""

from __future__ import annotations

import importlib
import re
import types
from typing import Any

import pytest
from celery.exceptions import ImproperlyConfigured
from celery.utils.collections import LimitedSet

from celery_extras import compat
from celery_extras.compat import CELERY_VERSION, PRIVATE, Private, check_worker, missing


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


@pytest.mark.parametrize("entry", PRIVATE, ids=[e.name for e in PRIVATE])
def test_private_attribute_has_the_shape_relied_on(entry: Private) -> None:
    problems = missing([entry])
    if entry.since is not None and version(CELERY_VERSION) < version(entry.since):
        assert entry.fallback, f"{entry.name} is missing before {entry.since} and needs a fallback"
        return
    assert problems == [], problems[0][1] if problems else ""


def test_every_private_attribute_is_listed_once() -> None:
    names = [e.name for e in PRIVATE]
    assert len(names) == len(set(names))
    assert {
        "celery.worker.state.task_scheduled",
        "celery.worker.request.Request._eta_timer_entry",
        "kombu.common.QoS.increment_eventually",
        "celery.events.receiver.EventReceiver._receive",
        "celery.local.PromiseProxy",
    } <= set(names)


def fake_modules(module: str, without: str) -> Any:
    """``import_module`` where *module* is a copy of the real one lacking *without*."""
    real = importlib.import_module(module)
    fake = types.ModuleType(module)
    fake.__dict__.update({k: v for k, v in vars(real).items() if k != without})

    def import_module(name: str) -> types.ModuleType:
        return fake if name == module else importlib.import_module(name)

    return import_module


def test_a_removed_attribute_is_named() -> None:
    problems = missing(import_module=fake_modules("celery.worker.state", "task_reserved"))
    assert [why.split(" (")[0] for _, why in problems if _.since is None] == [
        "celery.worker.state.task_reserved is missing"
    ]


def test_a_worker_does_not_start_without_a_required_attribute() -> None:
    with pytest.raises(ImproperlyConfigured) as excinfo:
        check_worker(fake_modules("celery.worker.state", "reserved_requests"))
    message = str(excinfo.value)
    assert message.startswith(f"celery-extras does not support Celery {CELERY_VERSION}")
    assert "celery.worker.state.reserved_requests is missing" in message
    assert "fair queues" in message


def test_an_attribute_with_a_fallback_only_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="celery_extras.compat")
    check_worker(fake_modules("celery.worker.state", "task_scheduled"))
    assert "celery.worker.state.task_scheduled is missing" in caplog.text
    assert "a held task is not either" in caplog.text


def test_an_attribute_of_another_shape_is_named() -> None:
    problems = missing(import_module=fake_modules("kombu.common", "QoS"))
    assert any("kombu.common.QoS.increment_eventually is missing" in w for _, w in problems)
    real = importlib.import_module("celery.worker.state")
    fake = types.ModuleType("celery.worker.state")
    fake.__dict__.update(vars(real))
    fake.revoked_stamps = []  # type: ignore[attr-defined]
    problems = missing(
        import_module=lambda n: fake if n == real.__name__ else importlib.import_module(n)
    )
    assert [w for e, w in problems if e.since is None] == [
        "celery.worker.state.revoked_stamps is not a dict {header: [values]}"
    ]


class Request:
    def __init__(self, task_id: str) -> None:
        self.id = task_id


class Entry:
    def cancel(self) -> None: ...


def test_held_tasks_fall_back_to_nothing_where_celery_tracks_no_scheduled_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = types.SimpleNamespace(requests={"r": "other"}, task_reserved=lambda r: None)
    monkeypatch.setattr(compat, "_state", state)
    request = Request("r")
    compat.track_held(request, Entry())  # Celery 5.5/5.6: no task_scheduled
    assert not hasattr(request, "_eta_timer_entry")
    compat.forget_held(request)
    assert state.requests == {}


def test_held_tasks_are_scheduled_where_celery_tracks_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduled: set[Any] = set()

    class CeleryRequest(Request):
        _eta_timer_entry = None

    state = types.SimpleNamespace(
        requests={}, scheduled_requests=scheduled, task_scheduled=scheduled.add
    )
    monkeypatch.setattr(compat, "_state", state)
    request, entry = CeleryRequest("r"), Entry()
    compat.track_held(request, entry)
    assert request._eta_timer_entry is entry and scheduled == {request}
    compat.forget_held(request)
    assert scheduled == set()


def test_limited_set_newest_with_and_without_its_dict() -> None:
    limited = LimitedSet(maxlen=10)
    for item in ("a", "b", "c"):
        limited.add(item)
    assert compat.limited_set_newest(limited, 2) == ["b", "c"]
    assert compat.limited_set_newest(limited, 9) == ["a", "b", "c"]
    assert compat.limited_set_newest(limited, 0) == []

    class Opaque:  # a LimitedSet of a release that keeps its items elsewhere
        def __iter__(self) -> Any:
            return iter(["a", "b"])

    assert compat.limited_set_newest(Opaque(), 1) == ["b"]
    assert compat.limited_set_newest(Opaque(), 0) == []
