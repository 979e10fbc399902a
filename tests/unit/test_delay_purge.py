"""Purging the delay store: which entries a purge of some queues names, the selection the
script reads, the gate dropping a purged entry's copy, ``app.control.purge()`` counting
parked tasks. The scripts run against Redis in ``tests/integration/test_delay_store.py``;
``celery purge`` and ``--drop`` on real workers in ``tests/integration/test_delay_purge.py``.
"""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import Mock

import pytest
from celery import Celery
from kombu import Exchange, Queue, binding

import celery_extras
from celery_extras.delay import purge as purge_module
from celery_extras.delay.gate import ArrivalGate
from celery_extras.delay.memory_store import MemoryDelayStore
from celery_extras.delay.purge import ParkedPurge, PurgingControl, drop_delayed, queue_selection
from celery_extras.delay.store import Purged, Selection, Taken, TakeStatus
from celery_extras.sync.client import DurableRevokes
from tests.support.clock import FakeClock
from tests.unit.test_delay_core import make_entry

DIRECT = Exchange("shared", type="direct")
DECLARED = [
    Queue("a", Exchange("a"), routing_key="a"),
    Queue("b", DIRECT, routing_key="k"),
    Queue("c", DIRECT, routing_key="k"),  # the same route as b
    Queue("d", DIRECT, routing_key="only-d"),
    Queue("t", Exchange("events", type="topic"), routing_key="t.#"),
    Queue("f", Exchange("fan", type="fanout")),
    Queue("m", bindings=[binding(Exchange("multi"), routing_key=k) for k in ("m1", "m2")]),
]


def test_a_purge_names_its_queues_and_the_routes_that_reach_them_alone() -> None:
    selection = queue_selection(DECLARED, ["a", "d", "m"])
    assert selection.queues == {"a", "d", "m"}
    assert selection.routes == {("a", "a"), ("shared", "only-d"), ("multi", "m1"),
                                ("multi", "m2"), ("", "a"), ("", "d"), ("", "m")}  # fmt: skip
    assert selection.tasks == frozenset() and selection.by_queue


def test_a_route_that_also_reaches_a_queue_not_purged_is_not_named() -> None:
    assert ("shared", "k") not in queue_selection(DECLARED, ["b"]).routes  # c gets it too
    assert ("shared", "k") in queue_selection(DECLARED, ["b", "c"]).routes


def test_routes_of_topic_and_fanout_exchanges_are_never_named() -> None:
    """Their bindings are patterns or none at all: whether a route reaches only purged
    queues cannot be told from the key, so entries routed so are kept (and counted)."""
    routes = queue_selection(DECLARED, ["t", "f"]).routes
    assert routes == {("", "t"), ("", "f")}
    assert not any(exchange in ("events", "fan") for exchange, _ in routes)


def test_due_queues_and_empty_names_name_nothing() -> None:
    """``celery purge -Q celery.extras-due`` empties that broker queue only: parked entries
    record the queue they serve, never a due queue."""
    selection = queue_selection(DECLARED, ["a.extras-due", ""])
    assert selection == Selection()
    assert not selection.by_queue


def test_the_selection_matches_by_name_then_queue_then_route() -> None:
    selection = Selection(queues=frozenset({"a"}), routes=frozenset({("x", "k")}),
                          tasks=frozenset({"proj.t"}))  # fmt: skip
    assert selection.matches("proj.t", "z", "", "")
    assert selection.matches("other", "a", "", "")
    assert not selection.matches("other", "b", "x", "k")  # a queue recorded: by queue only
    assert selection.matches("other", None, "x", "k")
    assert not selection.matches("other", None, "x", "other")
    assert json.loads(selection.dumps()) == {"q": ["a"], "r": [["x", "k"]], "n": ["proj.t"]}


def test_purged_counts_add_up() -> None:
    total = Purged(1, 2, 3) + Purged(10, 20, 30)
    assert total == Purged(11, 22, 33) and total.dropped == 33
    assert ParkedPurge(Purged(2, 1), due_messages=1).dropped == 3


def test_the_memory_store_purges_by_name_and_by_queue() -> None:
    store = MemoryDelayStore(FakeClock())
    store.park("e1", make_entry("t1"), 0.0)
    store.park("e2", make_entry("t2"), 60.0)
    (claim,) = store.claim(1.0, 30.0, ["tok"]).items
    assert store.purge(Selection(queues=frozenset({"other"}))) == Purged()
    assert store.purge(Selection(queues=frozenset({"q"}))) == Purged(parked=1, on_their_way=1)
    assert store.take("e1", "t1", claim.token) == Taken(TakeStatus.PURGED, 0.0, "limit")
    assert store.depth() == 0 and store.park("e2", make_entry("t2"), 0.0) is False


def test_the_gate_drops_and_counts_a_copy_of_a_purged_entry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parker = Mock()
    parker.store.take.return_value = Taken(TakeStatus.PURGED, -1.0, "eta")
    gate = ArrivalGate(Celery("t", set_as_current=False), parker, eta_store=True,
                       eta_threshold=30.0, store_retry=1.0)  # fmt: skip
    caplog.set_level("INFO", logger="celery_extras.delay.gate")
    headers = {"extras_parked": "e1", "extras_claim": "tok", "id": "t1"}
    assert gate.verify("proj.add", headers) == "drop"
    assert gate.counts["purged"] == 1 and gate.counts["duplicates"] == 0
    assert "dropping released proj.add[t1]: purged from the delay store" in caplog.text


def test_drop_delayed_refuses_what_cannot_be_a_task_name() -> None:
    app = Celery("t", set_as_current=False)
    for bad, says in (("", "expected a task name"), ("  ", "expected a task name"),
                      ("x" * 1001, "1001 characters")):  # fmt: skip
        with pytest.raises(ValueError, match=says):
            drop_delayed(app, bad)


def installed(app: Celery) -> Celery:
    return celery_extras.install(app)


def test_app_control_purge_adds_the_parked_tasks_it_drops(monkeypatch: Any) -> None:
    """Celery's count (the broker's queues: here memory://, empty) plus what the store
    dropped for the same queues, the app's consume_from; revokes still durable beside it."""
    app = installed(Celery("t", broker="memory://", set_as_current=False))
    app.conf.task_default_queue = "jobs"
    calls: list[tuple[list[str], Any]] = []

    def purge_parked(app: Celery, names: list[str], connection: Any = None) -> ParkedPurge:
        calls.append((sorted(names), connection))
        return ParkedPurge(Purged(parked=4, on_their_way=1))

    monkeypatch.setattr(purge_module, "purge_parked", purge_parked)
    monkeypatch.setattr(purge_module, "purges_parked", lambda app: True)
    assert isinstance(app.control, PurgingControl) and isinstance(app.control, DurableRevokes)
    assert app.control.purge() == 5
    assert app.control.discard_all() == 5
    assert [names for names, _ in calls] == [["jobs"], ["jobs"]]
    assert calls[0][1] is not None  # the connection Celery purged through
    monkeypatch.setattr(purge_module, "purges_parked", lambda app: False)
    assert app.control.purge() == 0 and len(calls) == 2  # no store: the broker only


def test_the_control_mixin_goes_on_any_control_class_and_on_one_made_already() -> None:
    from celery.app.control import Control

    class Mine(Control):  # a user's own control class
        pass

    mine = installed(Celery("t", control=Mine, set_as_current=False))
    assert isinstance(mine.control, Mine) and isinstance(mine.control, PurgingControl)
    early = Celery("t", set_as_current=False)
    made = early.control  # made before install: the very instance gets the mixin
    installed(early)
    assert early.control is made and isinstance(made, PurgingControl)
    again = installed(Celery("t", set_as_current=False))
    assert type(again.control) is type(installed(Celery("u", set_as_current=False)).control)


#: The app of the in-process ``celery purge`` runs below: memory broker, celery-extras on.
cli_app = installed(Celery("purge-cli", broker="memory://", set_as_current=False))
cli_app.conf.task_default_queue = "jobs"


def run_purge(*args: str) -> Any:
    from celery.bin.celery import celery as celery_command
    from click.testing import CliRunner

    return CliRunner().invoke(celery_command, ["-A", f"{__name__}:cli_app", "purge", *args])


def test_celery_purge_says_what_it_dropped_from_the_store_after_celerys_line(
    monkeypatch: Any,
) -> None:
    asked: list[list[str]] = []

    def purge_parked(app: Celery, names: Any, connection: Any = None) -> ParkedPurge:
        asked.append(sorted(names))
        return ParkedPurge(Purged(parked=3, on_their_way=1, kept=2), due_messages=1)

    monkeypatch.setattr(purge_module, "purges_parked", lambda app: app is cli_app)
    monkeypatch.setattr(purge_module, "purge_parked", purge_parked)
    done = run_purge("-f", "-Q", "jobs,more")
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        "No messages purged from 2 queues.",
        "Purged 4 parked tasks from the delay store.",
        "Kept 2 parked tasks recording no queue, whose exchange and routing key may lead to "
        "a queue not purged (`celery extras delayed --drop TASK_NAME` drops a task's).",
    ]
    assert asked == [["jobs", "more"]]
    monkeypatch.setattr(purge_module, "purge_parked", lambda *a, **k: ParkedPurge())
    assert run_purge("-f").output.splitlines()[-1] == "No parked tasks purged from the delay store."


def test_celery_purge_fails_naming_the_store_when_it_does_not_answer(monkeypatch: Any) -> None:
    def purge_parked(app: Celery, names: Any, connection: Any = None) -> ParkedPurge:
        raise purge_module.ParkedNotPurged(
            "the delay store did not answer (boom): the tasks parked for jobs were not purged "
            "and still run"
        )

    monkeypatch.setattr(purge_module, "purges_parked", lambda app: True)
    monkeypatch.setattr(purge_module, "purge_parked", purge_parked)
    done = run_purge("-f")
    assert done.exit_code == 1
    assert done.output.splitlines() == [
        "No messages purged from 1 queue.",
        "Error: the queues were purged, but the delay store did not answer (boom): the tasks "
        "parked for jobs were not purged and still run",
    ]
