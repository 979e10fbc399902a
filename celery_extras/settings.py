"""The ``extras_*`` settings: each declared once, with its default, its check and its doc.

Every setting lives in ``app.conf`` under the ``extras_`` prefix. A capability
declares the settings it reads; :func:`validate` checks them all and fails with
:class:`~celery.exceptions.ImproperlyConfigured` naming the culprit, so a typo in
a config file is caught at install or worker start, not hours later.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery.exceptions import ImproperlyConfigured

__all__ = [
    "CORE_SETTINGS",
    "PREFIX",
    "Setting",
    "boolean",
    "choice",
    "number",
    "optional",
    "redis_url",
    "reject",
    "text",
    "validate",
]

PREFIX = "extras_"

Check = Callable[[str, Any], Any]


@dataclass(frozen=True)
class Setting:
    """One ``extras_<name>`` setting: default, a check that normalises or rejects, and its doc."""

    name: str
    default: Any
    check: Check
    kind: str
    doc: str

    @property
    def key(self) -> str:
        return PREFIX + self.name


def reject(key: str, expected: str, value: object) -> ImproperlyConfigured:
    """The error for *value* of setting *key*, saying what was *expected*."""
    return ImproperlyConfigured(
        f"{key}: expected {expected}, got {value!r} ({type(value).__name__})"
    )


def number(
    *, minimum: float | None = None, above: float | None = None, integer: bool = False
) -> Check:
    """A real number (or an integer) bounded below; bools are not numbers here."""
    parts = ["an integer" if integer else "a number"]
    if minimum is not None:
        parts.append(f">= {minimum:g}")
    if above is not None:
        parts.append(f"> {above:g}")
    expected = " ".join(parts)

    def check(key: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
            raise reject(key, expected, value)
        if (
            not math.isfinite(value)
            or (minimum is not None and value < minimum)
            or (above is not None and value <= above)
        ):
            raise reject(key, expected, value)
        return value if integer else float(value)

    return check


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise reject(key, "True or False", value)
    return value


def text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise reject(key, "a non-empty string", value)
    return value


def choice(*choices: str) -> Check:
    """One of a fixed set of strings."""
    expected = "one of " + ", ".join(repr(c) for c in choices)

    def check(key: str, value: Any) -> str:
        if value not in choices:
            raise reject(key, expected, value)
        return str(value)

    return check


def optional(check: Check) -> Check:
    """*check*, or ``None`` (the setting's feature is off or derived from elsewhere)."""

    def check_optional(key: str, value: Any) -> Any:
        return None if value is None else check(key, value)

    return check_optional


def redis_url(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
        raise reject(key, "a redis://, rediss:// or unix:// URL", value)
    return value


CORE_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "redis_url",
        None,
        optional(redis_url),
        "str | None",
        "Redis holding the shared store (durable revokes, global token buckets, per-item "
        "failure counts). ``None`` uses the broker when it is Redis, else the result backend "
        "when that is Redis; with neither, the features that need the store say so at start.",
    ),
    Setting(
        "key_prefix",
        "celery-extras",
        text,
        "str",
        "Prefix of every key celery-extras writes to the shared store; give two apps that "
        "share one Redis different prefixes.",
    ),
)


def validate(conf: Mapping[str, Any], settings: Iterable[Setting]) -> dict[str, Any]:
    """Check every ``extras_*`` key of *conf*; return ``{name: value}`` with defaults filled in.

    Raises :class:`ImproperlyConfigured` for an unknown ``extras_*`` key (with the
    closest known name) or for a value its setting rejects.
    """
    known = {s.key: s for s in settings}
    for key in conf:
        if isinstance(key, str) and key.startswith(PREFIX) and key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ImproperlyConfigured(f"{key}: unknown celery-extras setting{hint}")
    return {s.name: s.check(key, conf.get(key, s.default)) for key, s in known.items()}
