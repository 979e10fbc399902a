from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, bootsteps
from celery.concurrency import get_implementation
from celery.exceptions import ImproperlyConfigured

import celery_extras
from celery_extras.capability import Capability
from celery_extras.install import ExtrasStep, all_settings, green_pool_acks, install, settings_of
from celery_extras.settings import Setting, number
from celery_extras.store.client import store_key, store_url

install_module = importlib.import_module("celery_extras.install")  # the package re-exports
# install() under the module's own name


class ProbeWorkerStep(bootsteps.StartStopStep):
    label = "probe-worker"


class ProbeConsumerStep(bootsteps.StartStopStep):
    label = "probe-consumer"


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Celery]]:
    """A capability that records each ``connect`` call, plugged in beside the real ones."""
    connected: list[Celery] = []
    capability = Capability(
        name="probe",
        settings=(Setting("probe_level", 1, number(minimum=0, integer=True), "int", "level"),),
        worker_steps=(ProbeWorkerStep,),
        consumer_steps=(ProbeConsumerStep,),
        connect=connected.append,
    )
    monkeypatch.setattr(install_module, "CAPABILITIES", (*install_module.CAPABILITIES, capability))
    yield connected


def make_app(**conf: Any) -> Celery:
    app = Celery("unit", broker="memory://", set_as_current=False)
    app.conf.update(conf)
    return app


def test_install_plugs_in_each_capability_once(probe: list[Celery]) -> None:
    app = make_app()
    assert install(app) is app
    install(app)
    install(app, probe_level=3)
    assert probe == [app]
    assert ProbeWorkerStep in app.steps["worker"] and ExtrasStep in app.steps["worker"]
    assert ProbeConsumerStep in app.steps["consumer"]
    assert len(app.steps["worker"]) == len({*app.steps["worker"]})
    assert settings_of(app)["probe_level"] == 3


def test_each_app_is_connected_separately(probe: list[Celery]) -> None:
    a, b = make_app(), make_app()
    install(a)
    install(b)
    assert probe == [a, b]


def test_options_are_settings_without_the_prefix() -> None:
    app = install(make_app(), key_prefix="mine")
    assert app.conf.extras_key_prefix == "mine"
    assert settings_of(app)["key_prefix"] == "mine"


def test_unknown_option_is_named() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"^extras_key_prefx: unknown"):
        install(make_app(), key_prefx="mine")


def test_misspelt_option_gets_the_did_you_mean_of_the_conf_spelling() -> None:
    message = (r"^extras_key_prefx: unknown celery-extras setting; "
               r"did you mean extras_key_prefix\? \(key_prefix=\.\.\.\)$")  # fmt: skip
    with pytest.raises(ImproperlyConfigured, match=message):
        install(make_app(), key_prefx="mine")
    with pytest.raises(ImproperlyConfigured, match=r"^extras_zzz: unknown celery-extras setting$"):
        install(make_app(), zzz=1)


def test_misspelled_setting_fails_at_install_on_a_configured_app() -> None:
    app = make_app(extras_redis_ulr="redis://localhost")
    app.conf.broker_url  # noqa: B018 - reading configures the app
    with pytest.raises(ImproperlyConfigured, match="did you mean extras_redis_url"):
        install(app)


def test_mistyped_setting_is_reported_when_the_app_is_configured_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("unit", set_as_current=False)
    install(app)
    app.config_from_object({"broker_url": "memory://", "extras_key_prefix": 5})
    app.conf.broker_url  # noqa: B018 - first read loads the config and validates it
    # Celery's signal dispatch logs what a receiver raises; the worker start then fails on it
    # (tests/integration/test_install.py).
    assert "extras_key_prefix: expected a non-empty string, got 5 (int)" in caplog.text
    with pytest.raises(ImproperlyConfigured, match=r"^extras_key_prefix: expected a non-empty"):
        settings_of(app)


def test_every_setting_is_documented_and_unique() -> None:
    names = [s.name for s in all_settings()]
    assert len(names) == len(set(names))
    for setting in all_settings():
        assert setting.doc and setting.kind
        assert setting.check(setting.key, setting.default) == setting.default


def test_public_api_is_reexported() -> None:
    for name in celery_extras.__all__:
        assert getattr(celery_extras, name) is not None


@pytest.mark.parametrize(
    ("conf", "url"),
    [
        ({"broker_url": "redis://h:1/0"}, "redis://h:1/0"),
        ({"broker_url": "amqp://g@h//", "result_backend": "redis://b/1"}, "redis://b/1"),
        ({"broker_url": "redis+socket:///tmp/r.sock"}, "unix:///tmp/r.sock"),
        ({"broker_url": "amqp://x", "extras_redis_url": "redis://s/3"}, "redis://s/3"),
        ({"broker_url": "redis://a/0;redis://b/0"}, "redis://a/0"),
        ({"broker_url": "amqp://x", "result_backend": "rpc://"}, None),
    ],
)
def test_store_url_prefers_the_setting_then_the_broker_then_the_backend(
    conf: dict[str, str], url: str | None
) -> None:
    assert store_url(install(make_app(**conf))) == url


def test_store_keys_live_under_the_prefix() -> None:
    app = install(make_app(), key_prefix="p")
    assert store_key(app, "revoked", "ids") == "p:revoked:ids"


@pytest.mark.parametrize(
    ("pool", "concurrency", "broker", "acks_late", "warned"),
    [("gevent", 20, "redis://127.0.0.1:1/0", True, True),
     ("eventlet", 11, "redis://127.0.0.1:1/0", True, True),
     ("gevent", 10, "redis://127.0.0.1:1/0", True, False),  # within broker_pool_limit (10)
     ("prefork", 20, "redis://127.0.0.1:1/0", True, False),  # one connection per process
     ("gevent", 20, "amqp://guest@127.0.0.1:1//", True, False),
     ("gevent", 20, "redis://127.0.0.1:1/0", False, False)],
)  # fmt: skip
def test_a_green_pool_over_the_broker_pool_with_late_acks_is_warned_of_by_setting(
    pool: str, concurrency: int, broker: str, acks_late: bool, warned: bool
) -> None:
    """kombu refuses acks over ``broker_pool_limit`` connections (MaxConnectionsError): on
    Redis with ``acks_late`` the message runs twice, so the worker start names the setting."""
    app = install(Celery("green", broker=broker, set_as_current=False))

    @app.task(name="green.late", acks_late=acks_late, shared=False)
    def late() -> None: ...

    warning = green_pool_acks(app, get_implementation(pool), concurrency)
    # shared tasks of other test modules join every app: those that ack late count too
    others = sorted(n for n, t in app.tasks.items() if t.acks_late and n != "green.late")
    if not acks_late and others and warned is False and pool == "gevent":
        assert warning is not None and "green.late" not in warning and others[0] in warning
        return
    assert (warning is not None) is warned
    if warning is not None:
        assert f"-P {pool} runs {concurrency} tasks at once over broker_pool_limit=10" in warning
        assert f"Set broker_pool_limit to at least {concurrency}" in warning
