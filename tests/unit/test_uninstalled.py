"""A task with a policy on an app without ``install(app)``: its worker refuses to start, a
send warns once per task name; installed apps, plain ones on purpose and in-process test
workers are left alone. The refusal of a real ``celery worker``:
tests/integration/test_install.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.apps.worker import Worker
from celery.contrib.testing.worker import TestWorkController
from celery.exceptions import ImproperlyConfigured

import celery_extras
from celery_extras import concurrency, limit
from celery_extras.admission import uninstalled
from celery_extras.admission.uninstalled import RefuseStart, unenforced


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(uninstalled, "_warned", set())
    yield


def make_app(name: str, install: bool = False, **conf: Any) -> Celery:
    """An app with one limited task ``<name>.limited`` and one plain task ``<name>.plain``."""
    app = Celery(name, broker="memory://", set_as_current=False)
    app.conf.update(conf)
    if install:
        celery_extras.install(app)

    @limit("2/s")
    @concurrency(1)
    @app.task(name=f"{name}.limited", shared=False)
    def limited() -> None: ...

    @app.task(name=f"{name}.plain", shared=False)
    def plain() -> None: ...

    return app


def worker_of(app: Celery, kind: type[Any] = Worker) -> Any:
    """A worker of *kind* as ``worker_init`` hands it (not started: its app is all we read)."""
    worker = kind.__new__(kind)
    worker.app = app
    return worker


def test_the_worker_of_an_app_without_install_refuses_to_start() -> None:
    app = make_app("a-forgot")  # first of the names: other tests' shared tasks may follow
    assert "a-forgot.limited" in unenforced(app) and "a-forgot.plain" not in unenforced(app)
    uninstalled._refuse_worker(sender=worker_of(app))
    assert RefuseStart in app.steps["worker"]
    with pytest.raises(ImproperlyConfigured) as refused:
        RefuseStart(worker_of(app))
    message = str(refused.value)
    assert "celery-extras is not installed on app 'a-forgot', yet its task(s) " in message
    assert "a-forgot.limited" in message and "a-forgot.plain" not in message
    assert "call celery_extras.install(app)" in message


@pytest.mark.parametrize(
    ("app", "kind"),
    [
        (lambda: make_app("installed", install=True), Worker),
        (lambda: make_app("on-purpose", extras_plain=True), Worker),
        (lambda: make_app("in-process"), TestWorkController),  # an in-process test worker
    ],
    ids=["installed", "plain-on-purpose", "in-process-test-worker"],
)
def test_installed_plain_on_purpose_and_in_process_workers_start(app: Any, kind: Any) -> None:
    made: Celery = app()
    uninstalled._refuse_worker(sender=worker_of(made, kind))
    assert RefuseStart not in made.steps["worker"]


def test_a_step_left_from_before_install_lets_the_worker_start() -> None:
    app = make_app("late")
    uninstalled._refuse_worker(sender=worker_of(app))
    celery_extras.install(app)
    RefuseStart(worker_of(app))  # installed since: no refusal
    assert unenforced(app) == []


def test_sending_a_policy_task_from_an_app_without_install_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app("sender")
    with caplog.at_level(logging.WARNING, logger=uninstalled.__name__):
        app.tasks["sender.limited"].delay()
        app.tasks["sender.limited"].apply_async()
        app.send_task("sender.limited")
        app.tasks["sender.plain"].delay()
    warned = [r.getMessage() for r in caplog.records if r.name == uninstalled.__name__]
    assert len(warned) == 1, warned
    assert warned[0].startswith("celery-extras: sending sender.limited: celery-extras is not ")
    assert "call celery_extras.install(app)" in warned[0]


@pytest.mark.parametrize("conf", [{"install": True}, {"extras_plain": True}])
def test_sending_from_an_installed_or_plain_app_is_silent(
    caplog: pytest.LogCaptureFixture, conf: dict[str, Any]
) -> None:
    app = make_app("quiet", **conf)
    with caplog.at_level(logging.WARNING, logger=uninstalled.__name__):
        app.tasks["quiet.limited"].delay()
        app.send_task("quiet.limited")
    assert [r for r in caplog.records if r.name == uninstalled.__name__] == []
