from __future__ import annotations

import math

import pytest
from celery.exceptions import ImproperlyConfigured

from celery_extras.settings import (
    Setting,
    boolean,
    choice,
    number,
    optional,
    redis_url,
    text,
    validate,
)

SETTINGS = (
    Setting("interval", 2.0, number(above=0), "float", "seconds"),
    Setting("size", 10, number(minimum=1, integer=True), "int", "entries"),
    Setting("on", True, boolean, "bool", "switch"),
    Setting("mode", "a", choice("a", "b"), "str", "mode"),
    Setting("url", None, optional(redis_url), "str | None", "url"),
    Setting("name", "x", text, "str", "name"),
)


def test_defaults_fill_in_when_nothing_is_set() -> None:
    assert validate({}, SETTINGS) == {
        "interval": 2.0, "size": 10, "on": True, "mode": "a", "url": None, "name": "x",
    }  # fmt: skip


def test_values_are_normalised() -> None:
    values = validate({"extras_interval": 3, "extras_url": "redis://h:1/2"}, SETTINGS)
    assert values["interval"] == 3.0 and isinstance(values["interval"], float)
    assert values["url"] == "redis://h:1/2"


def test_foreign_keys_are_ignored() -> None:
    assert validate({"broker_url": "x", 7: "y"}, SETTINGS)["size"] == 10


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("extras_interval", "two", "extras_interval: expected a number > 0, got 'two' (str)"),
        ("extras_interval", 0, "extras_interval: expected a number > 0, got 0 (int)"),
        ("extras_interval", math.nan, "extras_interval: expected a number > 0, got nan (float)"),
        ("extras_interval", True, "extras_interval: expected a number > 0, got True (bool)"),
        ("extras_size", 1.5, "extras_size: expected an integer >= 1, got 1.5 (float)"),
        ("extras_size", 0, "extras_size: expected an integer >= 1, got 0 (int)"),
        ("extras_on", "yes", "extras_on: expected True or False, got 'yes' (str)"),
        ("extras_mode", "c", "extras_mode: expected one of 'a', 'b', got 'c' (str)"),
        (
            "extras_url",
            "amqp://x",
            "extras_url: expected a redis://, rediss://, unix://, redis+cluster:// or "
            "sentinel:// URL",
        ),
        ("extras_name", "", "extras_name: expected a non-empty string, got '' (str)"),
    ],
)
def test_bad_values_name_the_setting(key: str, value: object, message: str) -> None:
    with pytest.raises(ImproperlyConfigured) as excinfo:
        validate({key: value}, SETTINGS)
    assert str(excinfo.value).startswith(message)


def test_misspelled_setting_is_named_with_a_suggestion() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"^extras_intervall: unknown celery-extras "
                       r"setting; did you mean extras_interval\?$"):  # fmt: skip
        validate({"extras_intervall": 1}, SETTINGS)


def test_unknown_setting_without_a_close_match() -> None:
    message = r"^extras_completely_different: unknown celery-extras setting$"
    with pytest.raises(ImproperlyConfigured, match=message):
        validate({"extras_completely_different": 1}, SETTINGS)
