"""The rule for a covered message (:mod:`celery_extras.admission.covered`), without a worker:
its ending context taken from a real Celery request, stored as bounded JSON, checked when
read back (a malformed or forged one is a logged drop), and its ending done with Celery's
own backend calls and signals (an in-memory broker and result backend)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from unittest.mock import Mock

import pytest
from celery import Celery, signals, states
from celery.contrib.testing.mocks import TaskMessage
from celery.worker import state as worker_state
from celery.worker.request import Request
from kombu.utils import json as kombu_json

from celery_extras.admission import covered
from celery_extras.admission.covered import (
    CONTEXT_VERSION,
    MAX_CONTEXT,
    CoveredEndings,
    CoveredMessage,
    Outcome,
    context_of,
    decode_context,
    encode_context,
    end_covered,
)
from celery_extras.signals import task_covered_ended
from tests.support.fake_consumer import Consumer


@pytest.fixture(autouse=True)
def ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids of this test's own (the in-memory result backend is the process's)."""
    prefix = uuid.uuid4().hex[:8]
    monkeypatch.setattr(f"{__name__}.ID", f"{prefix}-")


ID = ""


def tid(name: str) -> str:
    return f"{ID}{name}"


@pytest.fixture(scope="module")
def app() -> Iterator[Celery]:
    app = Celery("covered", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.result_extended = True

    @app.task(name="t.co")
    def co(x: int) -> int:
        return x

    @app.task(name="t.next")
    def following(value: Any, tag: str = "") -> Any:
        return value

    @app.task(name="t.errback")
    def errback(task_id: str) -> str:
        return task_id

    yield app
    app.close()


@pytest.fixture
def published() -> Iterator[list[tuple[str, dict[str, Any], Any]]]:
    """``(task name, headers, body)`` of every message published meanwhile."""
    seen: list[tuple[str, dict[str, Any], Any]] = []

    def note(sender: Any = None, headers: Any = None, body: Any = None, **kwargs: Any) -> None:
        seen.append((sender, dict(headers or {}), body))

    signals.before_task_publish.connect(note, weak=False, dispatch_uid="test_covered")
    yield seen
    signals.before_task_publish.disconnect(dispatch_uid="test_covered")


def request_of(app: Celery, task_id: str = "", **embed: Any) -> Request:
    """A real worker request for ``t.co(7)`` (id ``tid("c-1")`` unless given) with *embed*
    (callbacks, chain, chord...) in its body and a group, a root and a parent in its
    headers."""
    task_id = task_id or tid("c-1")
    callbacks, errbacks, chain = (embed.pop(k, None) for k in ("callbacks", "errbacks", "chain"))
    at = datetime(2024, 1, 2, tzinfo=UTC)
    message = TaskMessage("t.co", id=task_id, args=[7], kwargs={"at": at},
                          callbacks=callbacks, errbacks=errbacks, chain=chain,
                          group="g-1", group_index=3, root_id="root-1", parent_id="parent-1",
                          stamped_headers=["stamp"], stamps={"stamp": "s"})  # fmt: skip
    message.payload[2].update(embed)
    message.delivery_info = {"routing_key": "celery"}
    message.properties = {"reply_to": "reply-q", "correlation_id": task_id, "priority": 5}
    return Request(message, app=app, task=app.tasks["t.co"])


def sig(app: Celery, name: str, *args: Any, tag: str = "", **options: Any) -> dict[str, Any]:
    """A signature as a message carries it (a dict), with ``tag`` as its keyword if given."""
    return dict(app.signature(name, args=args, kwargs={"tag": tag} if tag else {}, **options))


# -- the context ----------------------------------------------------------------------------


def test_the_context_of_a_request_carries_what_its_end_needs_and_round_trips(
    app: Celery,
) -> None:
    request = request_of(
        app,
        callbacks=[sig(app, "t.next", tag="link")],
        errbacks=[sig(app, "t.errback")],
        chain=[sig(app, "t.next", tag="last"), sig(app, "t.next", tag="second")],
        chord=sig(app, "t.next", tag="body"),
    )
    context = context_of(request)
    assert context["v"] == CONTEXT_VERSION
    assert (context["id"], context["task"], context["group"], context["group_index"]) == (
        tid("c-1"), "t.co", "g-1", 3,
    )  # fmt: skip
    assert (context["root_id"], context["parent_id"], context["reply_to"]) == (
        "root-1", "parent-1", "reply-q",
    )  # fmt: skip
    assert context["delivery_info"] == {"routing_key": "celery", "priority": 5}
    assert [c["kwargs"]["tag"] for c in context["chain"]] == ["last", "second"]
    assert context["chord"]["kwargs"] == {"tag": "body"}
    assert (context["stamped_headers"], context["stamps"]) == (["stamp"], {"stamp": "s"})
    text = encode_context(context)
    back = decode_context(text, tid("c-1"))
    assert back is not None
    assert back["kwargs"]["at"] == datetime(2024, 1, 2, tzinfo=UTC)  # kombu's JSON types
    as_json = kombu_json.loads(kombu_json.dumps(context))  # tuples are lists in JSON
    assert back == {k: v for k, v in as_json.items() if k != "v"}


def test_a_context_too_large_leaves_out_the_arguments_then_everything(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    context = context_of(request_of(app, callbacks=[sig(app, "t.next")]))
    context["args"] = ["x" * MAX_CONTEXT]
    text = encode_context(context)
    back = decode_context(text, tid("c-1"))
    assert back is not None and "args" not in back and back["callbacks"]
    context["callbacks"] = [sig(app, "t.next", "y" * MAX_CONTEXT)]
    with caplog.at_level(logging.WARNING, logger="celery_extras.covered"):
        assert encode_context(context) == ""
    assert "over 65536 bytes" in caplog.text
    context["callbacks"] = [{"task": "t.next", "args": [object()]}]
    assert encode_context(context) == ""  # not JSON: its result only


def _stored(**changes: Any) -> str:
    context: dict[str, Any] = {"v": CONTEXT_VERSION, "id": "m-1", "task": "t.co", **changes}
    return str(kombu_json.dumps(context))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b"\xff\xfe", "not UTF-8"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not an object"),
        (_stored(v=99), "version 99"),
        (_stored(id="someone-else"), "the id 'someone-else'"),
        (_stored(task=""), "no task name"),
        (_stored(callbacks="t.next"), "its 'callbacks'"),
        (_stored(chain=[{"args": []}]), "its 'chain'"),
        (_stored(group_index="3"), "its 'group_index'"),
        (_stored(chord=[1]), "its 'chord'"),
        (_stored(ignore_result="no"), "its 'ignore_result'"),
        ("x" * (3 * MAX_CONTEXT), "bounded size"),
    ],
)
def test_a_malformed_or_forged_context_is_a_logged_drop(
    text: Any, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="celery_extras.covered"):
        assert decode_context(text, "m-1") is None
    assert why in caplog.text and "m-1" in caplog.text


def test_no_context_is_no_context() -> None:
    assert decode_context(None, "c-1") is None and decode_context("", "c-1") is None


# -- the ending ------------------------------------------------------------------------------


@pytest.fixture
def chord_parts(app: Celery, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, str, Any]]:
    """The chord parts the backend was told of: ``(request, state, result)``."""
    parts: list[tuple[Any, str, Any]] = []

    def part(request: Any, state: str, result: Any, **kwargs: Any) -> None:
        parts.append((request, state, result))

    monkeypatch.setattr(app.backend, "on_chord_part_return", part)
    return parts


def test_a_success_applies_callbacks_and_chain_counts_the_chord_part_and_signals(
    app: Celery, published: list[Any], chord_parts: list[Any]
) -> None:
    request = request_of(
        app,
        callbacks=[sig(app, "t.next", tag="link")],
        chain=[sig(app, "t.next", tag="last"), sig(app, "t.next", tag="second")],
        chord=sig(app, "t.next", tag="body"),
    )
    heard: list[tuple[str, Any]] = []

    def success(sender: Any = None, result: Any = None, **kwargs: Any) -> None:
        heard.append((sender.request.id, result))

    signals.task_success.connect(success, weak=False, dispatch_uid="test_covered.success")
    try:
        text = encode_context(context_of(request))
        message = CoveredMessage(tid("c-1"), decode_context(text, tid("c-1")))
        state = end_covered(app, "t.co", message, Outcome(states.SUCCESS, 42, None, "run-1"))
    finally:
        signals.task_success.disconnect(dispatch_uid="test_covered.success")
    assert state == states.SUCCESS
    link, following = published
    assert (link[0], list(link[2][0]), link[2][1]) == ("t.next", [42], {"tag": "link"})
    assert (link[1]["parent_id"], link[1]["root_id"]) == (tid("c-1"), "root-1")
    assert (following[0], list(following[2][0]), following[2][1]) == (
        "t.next", [42], {"tag": "second"},
    )  # fmt: skip
    assert [c["kwargs"]["tag"] for c in following[2][2]["chain"]] == ["last"]
    meta = app.backend.get_task_meta(tid("c-1"))
    assert (meta["status"], meta["result"], meta["name"], meta["args"]) == (
        "SUCCESS", 42, "t.co", [7],
    )  # fmt: skip
    ((part, part_state, part_result),) = chord_parts
    assert (part.id, part.group, part.group_index, part_state, part_result) == (
        tid("c-1"), "g-1", 3, "SUCCESS", 42,
    )  # fmt: skip
    assert heard == [(tid("c-1"), 42)]
    assert app.tasks["t.co"].request.id is None  # the covered request left the stack


def test_a_failure_calls_errbacks_fails_the_chain_and_the_chord_part(
    app: Celery, published: list[Any], chord_parts: list[Any]
) -> None:
    last = sig(app, "t.next", tag="last", task_id=tid("chain-last"))
    request = request_of(app, errbacks=[sig(app, "t.errback")], chain=[last],
                         chord=sig(app, "t.next"))  # fmt: skip
    failures: list[tuple[str, Any]] = []

    def failure(sender: Any = None, task_id: Any = None, exception: Any = None, **kw: Any) -> None:
        failures.append((task_id, exception))

    signals.task_failure.connect(failure, weak=False, dispatch_uid="test_covered.failure")
    try:
        error = KeyError("run-1 failed")
        message = CoveredMessage(tid("c-1"), context_of(request))
        state = end_covered(app, "t.co", message, Outcome(states.FAILURE, error, "tb", "run-1"))
    finally:
        signals.task_failure.disconnect(dispatch_uid="test_covered.failure")
    assert state == states.FAILURE
    ((name, headers, body),) = published  # the errback, called with the failed id
    assert (name, list(body[0]), headers["parent_id"]) == ("t.errback", [tid("c-1")], tid("c-1"))
    assert app.backend.get_task_meta(tid("c-1"))["status"] == "FAILURE"
    assert app.backend.get_task_meta(tid("chain-last"))["status"] == "FAILURE"  # chain fails
    ((part, part_state, _),) = chord_parts
    assert (part.id, part_state) == (tid("c-1"), "FAILURE")
    assert failures == [(tid("c-1"), error)]


def test_revoked_meanwhile_it_stays_revoked_and_a_revoked_run_revokes(
    app: Celery, published: list[Any], chord_parts: list[Any]
) -> None:
    request = request_of(app, callbacks=[sig(app, "t.next")], chord=sig(app, "t.next"))
    worker_state.revoked.add(tid("c-1"))
    try:
        message = CoveredMessage(tid("c-1"), context_of(request))
        assert end_covered(app, "t.co", message, Outcome(states.SUCCESS, 1)) == states.REVOKED
    finally:
        worker_state.revoked.discard(tid("c-1"))
    assert published == [] and app.backend.get_task_meta(tid("c-1"))["status"] == "REVOKED"
    other_request = request_of(app, tid("c-2"), chord=sig(app, "t.next"))
    other = CoveredMessage(tid("c-2"), context_of(other_request))
    assert end_covered(app, "t.co", other, Outcome(states.REVOKED, None)) == states.REVOKED
    assert [(p.id, s) for p, s, _ in chord_parts] == [
        (tid("c-1"), "REVOKED"), (tid("c-2"), "REVOKED"),
    ]  # fmt: skip


def test_without_a_context_only_the_result_is_stored(
    app: Celery, published: list[Any], chord_parts: list[Any]
) -> None:
    message = CoveredMessage(tid("old-1"))
    assert end_covered(app, "t.co", message, Outcome(states.SUCCESS, 5)) == states.SUCCESS
    assert app.backend.get_task_meta(tid("old-1"))["result"] == 5
    assert published == [] and chord_parts == []


# -- from the timer --------------------------------------------------------------------------


def test_endings_wait_for_the_run_s_result_then_end_a_few_per_turn(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(covered, "CHUNK", 2)
    consumer, endings = Consumer(), CoveredEndings(app)
    ended: list[tuple[str, str, str]] = []

    def heard(sender: Any = None, task_id: Any = None, state: Any = None, **kw: Any) -> None:
        ended.append((sender, task_id, state))

    done = Mock()
    messages = [CoveredMessage(tid(f"c{i}")) for i in range(3)]
    task_covered_ended.connect(heard, weak=False, dispatch_uid="test_covered.ended")
    try:
        endings.schedule(consumer, "t.co", tid("run-1"), messages, done=done)
        _, fun, args = consumer.scheduled.pop(0)
        fun(*args)  # the run's result is not there yet: asked again later
        spacing, fun, args = consumer.scheduled.pop(0)
        assert spacing == covered.SPACING and ended == []
        app.backend.store_result(tid("run-1"), 9, states.SUCCESS)
        fun(*args)  # two end now, the third on the next turn
        assert [i for _, i, _ in ended] == [tid("c0"), tid("c1")] and not done.called
        _, fun, args = consumer.scheduled.pop(0)
        fun(*args)
    finally:
        task_covered_ended.disconnect(dispatch_uid="test_covered.ended")
    assert ended == [("t.co", tid(f"c{i}"), "SUCCESS") for i in range(3)]
    assert done.call_count == 1 and endings.counts["ended"] == 3
    assert [app.backend.get_task_meta(tid(f"c{i}"))["result"] for i in range(3)] == [9, 9, 9]


def test_a_task_that_stores_no_result_ends_with_what_the_worker_saw(
    app: Celery, published: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app.tasks["t.co"], "ignore_result", True)
    consumer, endings = Consumer(), CoveredEndings(app)
    request = request_of(app, errbacks=[sig(app, "t.errback")])
    seen = Outcome(states.FAILURE, ValueError("boom"), None, "run-1")
    message = CoveredMessage(tid("c-1"), context_of(request))
    endings.schedule(consumer, "t.co", "run-1", [message], known=seen)
    _, fun, args = consumer.scheduled.pop(0)
    fun(*args)
    assert endings.counts["ended"] == 1
    assert [name for name, _, _ in published] == ["t.errback"]
    assert app.backend.get_task_meta(tid("c-1"))["status"] == "PENDING"  # as Celery: ignored


def end_one_on_the_timer(app: Celery) -> tuple[CoveredEndings, Mock, list[float]]:
    """Schedule the ending of ``c0``, covered by a run that succeeded with 9, and run the
    consumer's timer until it is empty: the endings, their ``done``, and each entry's wait."""
    consumer, endings, done = Consumer(), CoveredEndings(app), Mock()
    app.backend.store_result(tid("run-1"), 9, states.SUCCESS)
    endings.schedule(consumer, "t.co", tid("run-1"), [CoveredMessage(tid("c0"))], done=done)
    waits = []
    while consumer.scheduled:
        wait, fun, args = consumer.scheduled.pop(0)
        waits.append(wait)
        fun(*args)
    return endings, done, waits


def test_an_ending_that_failed_is_ended_again_and_done_only_then_seed_444331(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chaos seed 444331: a covered message's ending failed (a callback's publish as the
    broker restarted), was counted as an error and skipped, and ``done`` said the run's
    endings were published: the message stayed ``PENDING`` for good. Now it is ended again
    after 1 s, then 2 s..., and ``done`` comes after it ended."""
    real, calls = covered.end_covered, []

    def broker_down_twice(app: Celery, name: str, message: Any, outcome: Any) -> str:
        calls.append(message.id)
        if len(calls) <= 2:
            raise ConnectionError("[Errno 111] ECONNREFUSED")
        return real(app, name, message, outcome)

    monkeypatch.setattr(covered, "end_covered", broker_down_twice)
    endings, done, waits = end_one_on_the_timer(app)
    assert waits == [0.0, 1.0, 2.0] and calls == [tid("c0")] * 3
    assert done.call_count == 1 and endings.counts["ended"] == 1
    assert endings.counts["errors"] == 2 and endings.counts["gave_up"] == 0
    assert app.backend.get_task_meta(tid("c0"))["result"] == 9


def test_an_ending_that_never_succeeds_is_given_up_after_patience(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    def always_down(app: Celery, name: str, message: Any, outcome: Any) -> str:
        raise ConnectionError("[Errno 111] ECONNREFUSED")

    monkeypatch.setattr(covered, "end_covered", always_down)
    monkeypatch.setattr(covered, "PATIENCE", 12.0)
    endings, done, waits = end_one_on_the_timer(app)
    assert waits == [0.0, 1.0, 2.0]  # then 3 * SLOW >= PATIENCE: given up
    assert done.call_count == 1 and endings.counts["gave_up"] == 1
