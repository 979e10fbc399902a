"""The settings object of an app: validated once, re-validated on change, Django's namespace."""

from __future__ import annotations

import types

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured

import celery_extras
from celery_extras import settings as settings_module
from celery_extras.settings import KEY_PREFIX, ExtrasSettings, settings_of


def count_validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = settings_module.validate

    def counting(*args: object, **kwargs: object) -> dict[str, object]:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(settings_module, "validate", counting)
    return calls


def test_a_client_revoke_validates_the_settings_once(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("unit", broker="memory://", set_as_current=False)
    # the store refuses at once: the revoke is logged as not stored, and still broadcast
    celery_extras.install(app, redis_url="redis://127.0.0.1:1/0")
    app.conf.extras_revoke_expires = 50.0  # changed after install: validated again, once
    calls = count_validations(monkeypatch)
    app.control.revoke("some-task-id")
    assert len(calls) == 1
    app.control.revoke("other-task-id")
    app.control.revoke_by_stamped_headers({"h": "v"})
    assert len(calls) == 1
    assert settings_of(app)["revoke_expires"] == 50.0


def test_the_same_object_until_a_setting_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    app = celery_extras.install(Celery("unit", broker="memory://", set_as_current=False))
    first = settings_of(app)
    calls = count_validations(monkeypatch)
    assert settings_of(app) is first and calls == []
    celery_extras.install(app, key_prefix="other")
    second = settings_of(app)
    assert second[KEY_PREFIX] == "other" and first[KEY_PREFIX] == "celery-extras"
    assert len(calls) == 1
    app.conf.extras_queue_weights = {"a": 2}
    assert settings_of(app)["queue_weights"] == {"a": 2}
    app.conf.extras_queue_weights["a"] = 0  # changed in place: seen, and rejected
    with pytest.raises(ImproperlyConfigured, match=r"extras_queue_weights\['a'\]"):
        settings_of(app)


def test_the_settings_object_is_read_only_and_a_mapping() -> None:
    values = settings_of(celery_extras.install(Celery("unit", set_as_current=False)))
    assert isinstance(values, ExtrasSettings)
    assert values["key_prefix"] == values[KEY_PREFIX] == "celery-extras"
    assert dict(values)["sync_enabled"] is True
    with pytest.raises(AttributeError, match="read-only"):
        values.anything = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        values["key_prefix"] = "x"  # type: ignore[index]


def test_an_app_without_celery_extras_is_named() -> None:
    app = Celery("bare", set_as_current=False)
    with pytest.raises(ImproperlyConfigured, match=r"not installed on .*bare.*install\(app\)"):
        settings_of(app)


def django_like_settings(**extra: object) -> types.ModuleType:
    """A settings module as Django's ``django.conf:settings`` presents it (upper case)."""
    module = types.ModuleType("proj_settings")
    module.DEBUG = True  # type: ignore[attr-defined]
    module.EXTRAS_NOT_OURS = 1  # type: ignore[attr-defined]  # another app's setting
    module.CELERY_BROKER_URL = "memory://"  # type: ignore[attr-defined]
    for key, value in extra.items():
        setattr(module, key, value)
    return module


def namespaced_app(**extra: object) -> Celery:
    app = Celery("django_proj", set_as_current=False)
    app.config_from_object(django_like_settings(**extra), namespace="CELERY")
    return app


def test_django_namespace_settings_are_read() -> None:
    app = celery_extras.install(
        namespaced_app(CELERY_EXTRAS_KEY_PREFIX="site-a", CELERY_EXTRAS_STATS_INTERVAL=5)
    )
    values = settings_of(app)
    assert values["key_prefix"] == "site-a" and values["stats_interval"] == 5.0


def test_install_options_override_django_settings() -> None:
    app = celery_extras.install(namespaced_app(CELERY_EXTRAS_KEY_PREFIX="site-a"), key_prefix="b")
    assert settings_of(app)["key_prefix"] == "b"


def test_django_namespace_typo_is_rejected_like_the_unprefixed_one() -> None:
    app = namespaced_app(CELERY_EXTRAS_KEY_PREFX="site-a")
    app.conf.broker_url  # noqa: B018 - reading configures the app
    message = (
        r"^CELERY_EXTRAS_KEY_PREFX: unknown celery-extras setting; "
        r"did you mean CELERY_EXTRAS_KEY_PREFIX\?$"
    )
    with pytest.raises(ImproperlyConfigured, match=message):
        celery_extras.install(app)


def test_django_namespace_bad_value_names_the_key_as_written() -> None:
    app = namespaced_app(CELERY_EXTRAS_SYNC_INTERVAL=0)
    app.conf.broker_url  # noqa: B018
    with pytest.raises(ImproperlyConfigured, match=r"^CELERY_EXTRAS_SYNC_INTERVAL: expected a"):
        celery_extras.install(app)
