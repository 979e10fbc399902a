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
from celery import Celery
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


# -- celery purge ------------------------------------------------------------------------------

#: The app of the in-process ``celery purge`` runs below (memory broker: no server needed).
purge_app = Celery("compat-purge", broker="memory://", set_as_current=False)
purge_app.conf.task_default_queue = "jobs"


def run_purge(*args: str, answer: str | None = None) -> Any:
    from celery.bin.celery import celery as celery_command
    from click.testing import CliRunner

    return CliRunner().invoke(
        celery_command, ["-A", f"{__name__}:purge_app", "purge", *args], input=answer
    )


def test_celery_purge_tells_what_it_emptied_once_it_did() -> None:
    """The queues ``celery purge`` empties reach the hook after Celery's own line, as
    ``-Q`` and ``-X`` select them; a purge refused at its prompt calls nothing."""
    seen: list[set[str]] = []

    def after(ctx: Any, names: set[str]) -> None:
        assert ctx.obj.app is purge_app
        seen.append(names)
        ctx.obj.echo("after the purge")

    assert compat.after_purge_command(after) is True
    assert compat.after_purge_command(after) is True  # once, however often asked
    try:
        done = run_purge("-f")
        assert done.exit_code == 0, done.output
        assert done.output == "No messages purged from 1 queue.\nafter the purge\n"
        assert run_purge("-f", "-Q", "a,b,c", "-X", "b").exit_code == 0
        assert run_purge("-f", "-X", "jobs").exit_code == 0
        refused = run_purge("-Q", "a", answer="n\n")
        assert refused.exit_code == 1 and "Aborted" in refused.output
        assert seen == [{"jobs"}, {"a", "c"}, set()]
    finally:
        compat.after_purge_command(after, on=False)
    assert run_purge("-f").exit_code == 0 and len(seen) == 3


def test_the_queues_celery_purge_empties_are_computed_as_celery_does() -> None:
    assert compat.purge_command_queues(purge_app, None, None) == {"jobs"}
    assert compat.purge_command_queues(purge_app, ["a", "b"], ["b", "z"]) == {"a"}
    assert compat.control_purge_queues(purge_app) == ["jobs"]


def test_celery_purge_is_left_alone_when_celery_changed_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another shape (options renamed, queues chosen otherwise): not wrapped, the hook is not
    registered, and ``celery purge`` empties the broker's queues only (the fallback)."""
    seen: list[set[str]] = []
    monkeypatch.setattr(compat, "missing", lambda entries: [(e, "moved") for e in entries])
    assert compat.after_purge_command(lambda ctx, names: seen.append(names)) is False
    monkeypatch.undo()
    assert run_purge("-f").exit_code == 0 and seen == []


def test_celery_purge_help_says_what_else_it_drops_once() -> None:
    from celery.bin.purge import purge

    import celery_extras.cli  # noqa: F401  (the entry point's import extends the command)

    before = purge.help
    try:
        assert compat.after_purge_command(lambda ctx, names: None, on=False, note="A note.")
        assert compat.after_purge_command(lambda ctx, names: None, on=False, note="A note.")
        help_text = purge.help or ""
    finally:
        purge.help = before
    assert help_text.startswith("Erase all messages") and help_text.count("A note.") == 1
    assert help_text.count("the tasks its delay store holds for these queues") == 1


def test_request_embed_reads_the_body_s_embed_with_and_without_the_private_payload() -> None:
    """A worker request's callbacks, errbacks, chain and chord (the body's third part), from
    ``Request._payload``, else from the message's payload (the same tuple)."""
    from types import SimpleNamespace

    from celery import Celery
    from celery.contrib.testing.mocks import TaskMessage
    from celery.worker.request import Request

    app = Celery("compat", broker="memory://", set_as_current=False)

    @app.task(name="t.embedded")
    def embedded() -> None: ...

    message = TaskMessage("t.embedded", callbacks=[{"task": "t.next"}], chain=[{"task": "t.c"}])
    message.delivery_info, message.properties = {}, {}
    request = Request(message, app=app, task=app.tasks["t.embedded"])
    embed = compat.request_embed(request)
    assert (embed["callbacks"], embed["chain"], embed["errbacks"]) == (
        [{"task": "t.next"}], [{"task": "t.c"}], None,
    )  # fmt: skip
    without = SimpleNamespace(message=SimpleNamespace(payload=((), {}, {"chord": {"task": "b"}})))
    assert compat.request_embed(without) == {"chord": {"task": "b"}}
    assert compat.request_embed(SimpleNamespace(message=None)) == {}
    app.close()


def test_the_redis_restore_interval_is_kombus_setting_or_its_default() -> None:
    from kombu import Connection
    from kombu.transport.redis import Channel

    if not hasattr(Channel, "unacked_restore_interval"):  # kombu 5.5, 5.6: 10 s, fixed
        options = {"unacked_restore_interval": 2}
        assert compat.restore_interval(Connection("redis://", transport_options=options)) == (
            compat.RESTORE_INTERVAL
        )
        return
    assert compat.restore_interval(Connection("redis://")) == Channel.unacked_restore_interval
    options = {"unacked_restore_interval": 2}
    assert compat.restore_interval(Connection("redis://", transport_options=options)) == 2.0
    for bad in (0, "soon"):  # kombu's timer falls back to its default too
        options = {"unacked_restore_interval": bad}
        assert compat.restore_interval(Connection("redis://", transport_options=options)) == (
            Channel.unacked_restore_interval
        )
