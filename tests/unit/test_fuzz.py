"""Fuzz (hypothesis): every control command, every setting and every reader of store
contents or neighbours' replies, fed arbitrary JSON values (issue 17).

Each must answer (an ``ok``/``error`` reply, a value, or its documented error), never
raise anything else, and keep its replies short whatever it was given. The same
commands and store contents are sent to a real worker in
``tests/reliability/test_hostile_fuzz.py``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured
from celery.utils.collections import LimitedSet
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from celery_extras import install
from celery_extras.admission.pipeline import PIPELINE_ATTR, Pipeline
from celery_extras.admission.registry import TaskPolicies
from celery_extras.install import all_settings
from celery_extras.limits.control import extras_limit, extras_limit_reset
from celery_extras.limits.gate import LimitGate
from celery_extras.limits.redis_bucket import Override
from celery_extras.limits.spec import LimitSpec
from celery_extras.retries.redis_failure_memory import RedisCounts
from celery_extras.settings import validate
from celery_extras.sync.control import (
    HELLO_REPLY_BYTES,
    SYNCER_ATTR,
    extras_revoked,
    extras_sync_hello,
)
from celery_extras.sync.entries import (
    parse_expiring,
    parse_ids,
    parse_stamp_member,
    parse_stamps,
)
from celery_extras.sync.revoke_store import _decode_entries
from celery_extras.sync.state import WorkerRevokes
from celery_extras.sync.syncer import Syncer

#: Any JSON value, including what Python's json also reads (NaN, Infinity, huge ints).
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(10**300, 10**5000) | st.floats()
    | st.text(max_size=50) | st.text(min_size=5000, max_size=6000, alphabet="ab/s1"),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=5),
    max_leaves=10,
)  # fmt: skip
#: The same without the long strings, for tests that draw many values per example.
SMALL_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(10**300, 10**400) | st.floats()
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=5,
)  # fmt: skip
SETTINGS = {
    "delay_max_hold": 2.0, "limit_on_store_error": "local", "store_retry": 1.0,
    "sync_interval": 1.0, "sync_reply_max": 100, "sync_hello_timeout": 0.1,
    "revoke_max": 100, "revoke_expires": 100.0,
}  # fmt: skip
FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
MAX_REPLY = 1000  # characters of a command's reply, whatever the arguments


@pytest.fixture(scope="module")
def state() -> Any:
    app = install(Celery("fuzz", broker="redis://127.0.0.1:1/0", set_as_current=False))
    pipeline = Pipeline([LimitGate(app, SETTINGS)])
    pipeline.register("t", TaskPolicies(limits=(LimitSpec(10.0, 1, "worker", None, "10/s"),)))
    revokes = WorkerRevokes(LimitedSet(maxlen=1000, expires=100.0), {}, 100.0)
    revokes.merge_ids({f"id{i}": None for i in range(50)}, stored=False)
    syncer = Syncer(app, "me@host", revokes, SETTINGS)
    consumer = SimpleNamespace(**{PIPELINE_ATTR: pipeline, SYNCER_ATTR: syncer})
    return SimpleNamespace(consumer=consumer, app=app, hostname="me@host")


def _short_json(reply: object) -> None:
    text = json.dumps(reply)
    assert len(text) < MAX_REPLY, text[:200]


@FUZZ
@given(task_name=JSON | st.just("t"), rate=JSON, burst=JSON, extra=st.dictionaries(
    st.text(max_size=5).filter(lambda k: k not in ("state", "task_name", "rate", "burst")), JSON,
    max_size=2))  # fmt: skip
def test_extras_limit_answers_any_arguments_briefly(
    state: Any, task_name: Any, rate: Any, burst: Any, extra: dict[str, Any]
) -> None:
    reply = extras_limit(state, task_name, rate, burst, **extra)
    assert set(reply) in ({"ok"}, {"error"}), reply
    _short_json(reply)
    extras_limit_reset(state, "t")


@FUZZ
@given(task_name=JSON)
def test_extras_limit_reset_answers_any_arguments_briefly(state: Any, task_name: Any) -> None:
    reply = extras_limit_reset(state, task_name)
    assert set(reply) in ({"ok"}, {"error"}), reply
    _short_json(reply)


@FUZZ
@given(limit=JSON)
def test_extras_revoked_answers_any_limit(state: Any, limit: Any) -> None:
    reply = extras_revoked(state, limit)
    assert isinstance(reply, dict) and ("error" in reply or "ids" in reply), reply
    if "error" in reply:
        _short_json(reply)


@FUZZ
@given(from_node=JSON, clock=JSON)
def test_extras_sync_hello_answers_any_arguments_within_its_budget(
    state: Any, from_node: Any, clock: Any
) -> None:
    reply = extras_sync_hello(state, from_node, clock)
    assert reply is None or len(json.dumps(reply)) <= HELLO_REPLY_BYTES + 100
    assert state.app.clock.value < 10**18


@FUZZ
@given(body=JSON)
def test_a_hello_reply_of_any_shape_is_merged_or_dropped(state: Any, body: Any) -> None:
    syncer: Syncer = getattr(state.consumer, SYNCER_ATTR)
    syncer.hello.on_reply(body)
    syncer.hello.on_reply({"other@host": body})
    syncer.drain()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.data_too_large, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_setting_takes_any_json_or_refuses_it_by_name(data: st.DataObject) -> None:
    for setting in all_settings():
        value = data.draw(SMALL_JSON, label=setting.key)
        try:
            validate({setting.key: value}, all_settings())
        except ImproperlyConfigured as exc:
            assert str(exc).startswith(setting.key), exc
            assert len(str(exc)) < MAX_REPLY, str(exc)[:200]


@FUZZ
@given(value=JSON)
def test_a_stored_override_of_any_json_is_read_or_refused_briefly(value: Any) -> None:
    try:
        raw = json.dumps(value)
    except ValueError:
        return
    try:
        override = Override.loads(raw)
    except ValueError as exc:
        assert len(str(exc)) < MAX_REPLY
    else:
        assert 1 / 86400 <= override.rate <= 1e6 and len(override.text) <= 32


@FUZZ
@given(value=JSON)
def test_stored_and_neighbour_revokes_of_any_json_are_kept_or_dropped(value: Any) -> None:
    pairs = value if isinstance(value, list) else [value]
    parse_expiring([p if isinstance(p, list) and len(p) == 2 else (p, p) for p in pairs], 0.0)
    parse_expiring([(p, 1e9) for p in pairs], 0.0, stamps=True)
    for parsed in (parse_ids(value, 100), parse_stamps(value, 100)):
        assert len(parsed.kept) <= 100
    try:
        text = json.dumps(value)
    except ValueError:
        return
    parse_stamp_member(text)
    _decode_entries(text)


class GarbageClient:
    """A Redis client whose every key holds *value*."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self, key: str) -> Any:
        return self.value


@FUZZ
@given(value=st.text(max_size=5000) | st.binary(max_size=50).map(repr))
@example(value="-1")  # found by this test in CI: a negative count read as one
def test_a_failure_count_of_any_text_reads_as_a_count(value: str) -> None:
    count = RedisCounts(GarbageClient(value), "p", 1.0).get("item")  # type: ignore[arg-type]
    assert isinstance(count, int) and count >= 0
