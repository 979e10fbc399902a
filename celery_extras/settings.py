"""The ``extras_*`` settings: each declared once, with its default, its check and its doc.

Every setting lives in ``app.conf`` under the ``extras_`` prefix (or, for an app
configured with a namespace such as Django's ``CELERY``, under ``CELERY_EXTRAS_``).
A capability declares the settings it reads; ``install(app)`` hands the declarations
of every capability to :func:`declare`, and :func:`settings_of` validates them once
into a frozen :class:`ExtrasSettings`, failing with
:class:`~celery.exceptions.ImproperlyConfigured` naming the culprit, so a typo in a
config file is caught at install or worker start, not hours later.

This module imports no capability: the steps read their settings here, so there
is no import circle through ``install``.
"""

from __future__ import annotations

import copy
import difflib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, overload
from urllib.parse import parse_qs, urlsplit

from celery import Celery
from celery.exceptions import ImproperlyConfigured

from .bounds import shown
from .checks import is_int, is_number

__all__ = [
    "CORE_SETTINGS",
    "KEY_PREFIX",
    "PREFIX",
    "REDIS_OPTIONS",
    "REDIS_URL",
    "STORE_ALLOW_EVICTION",
    "STORE_RETRY",
    "STORE_TIMEOUT",
    "ExtrasSettings",
    "Setting",
    "boolean",
    "choice",
    "conf_key",
    "declare",
    "declared_settings",
    "deprecated_name",
    "integer",
    "number",
    "optional",
    "redis_options",
    "redis_url",
    "reject",
    "settings_of",
    "text",
    "url_problem",
    "validate",
]

T = TypeVar("T")

PREFIX = "extras_"

#: A check: ``check(key, value)`` returns the value (normalised) or raises :func:`reject`'s error.
Check = Callable[[str, Any], T]


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One ``extras_<name>`` setting: default, a check that normalises or rejects, and its doc.

    ``settings_of(app)[setting]`` is typed by the check: a ``Setting[float]`` gives a float.
    """

    name: str
    default: Any
    check: Check[T]
    kind: str
    doc: str
    #: earlier names of the setting, still read for one minor release, with a warning
    formerly: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return PREFIX + self.name


def reject(key: str, expected: str, value: object) -> ImproperlyConfigured:
    """The error for *value* of setting *key*, saying what was *expected*."""
    return ImproperlyConfigured(
        f"{key}: expected {expected}, got {shown(value)} ({type(value).__name__})"
    )


@overload
def number(
    *, minimum: float | None = None, above: float | None = None, integer: Literal[False] = False
) -> Check[float]: ...
@overload
def number(
    *, minimum: float | None = None, above: float | None = None, integer: Literal[True]
) -> Check[int]: ...
def number(
    *, minimum: float | None = None, above: float | None = None, integer: bool = False
) -> Check[Any]:
    """A finite real number (or an integer) bounded below; bools are not numbers here."""
    parts = ["an integer" if integer else "a number"]
    if minimum is not None:
        parts.append(f">= {minimum:g}")
    if above is not None:
        parts.append(f"> {above:g}")
    expected = " ".join(parts)

    def check(key: str, value: Any) -> Any:
        if not is_number(value, minimum, above) or (integer and not is_int(value)):
            raise reject(key, expected, value)
        return value if integer else float(value)

    return check


def integer(*, minimum: int | None = None, maximum: int | None = None) -> Check[int]:
    """An ``int`` (not a bool) within ``[minimum, maximum]``."""
    parts = ["an integer"]
    if minimum is not None:
        parts.append(f">= {minimum}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    expected = " ".join(parts)

    def check(key: str, value: Any) -> int:
        if not is_int(value, minimum, maximum):
            raise reject(key, expected, value)
        return value

    return check


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise reject(key, "True or False", value)
    return value


def text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise reject(key, "a non-empty string", value)
    return value


def choice(*choices: str) -> Check[str]:
    """One of a fixed set of strings."""
    expected = "one of " + ", ".join(repr(c) for c in choices)

    def check(key: str, value: Any) -> str:
        if value not in choices:
            raise reject(key, expected, value)
        return str(value)

    return check


def optional(check: Check[T]) -> Check[T | None]:
    """*check*, or ``None`` (the setting's feature is off or derived from elsewhere)."""

    def check_optional(key: str, value: Any) -> T | None:
        return None if value is None else check(key, value)

    return check_optional


_STORE_SCHEMES = (
    "redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://", "sentinel://",
)  # fmt: skip


def redis_url(key: str, value: Any) -> str:
    """A store URL that can work: its scheme, and in each ``;``-separated part its host, port
    and database (no connection is made: a store that does not answer is an outage)."""
    if not isinstance(value, str) or not value.startswith(_STORE_SCHEMES):
        raise reject(
            key, "a redis://, rediss://, unix://, redis+cluster:// or sentinel:// URL", value
        )
    scheme = value.split("://", 1)[0]
    for part in (p for p in value.split(";") if p):
        problem = url_problem(part, scheme)
        if problem:
            raise ImproperlyConfigured(f"{key}: {problem}")
    return value


def url_problem(part: str, scheme: str) -> str | None:
    """What makes *part*, one URL of a store of *scheme* (``redis``, ``sentinel``...), unusable
    whatever the network does, or ``None``. The database's upper bound (the server's
    ``databases``, 16 by default) is known only to the server: Redis refuses a larger one."""
    split = urlsplit(part)
    port = split.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]  # IPv6 too
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
        return f"port {port!r}: expected a number from 1 to 65535"
    if scheme == "unix":
        if not split.path:
            return "expected the socket's path (unix:///path/to/redis.sock)"
    elif not split.hostname and scheme not in ("redis", "rediss"):
        return f"no host in {part.split('@')[-1]!r}"
    databases = parse_qs(split.query).get("db", [])
    if scheme != "unix" and split.path.strip("/"):
        databases.append(split.path.strip("/"))
    for db in databases:
        if not (db.isascii() and db.isdigit()):
            return f"database {db!r}: expected a number >= 0"
        if "cluster" in scheme and int(db) != 0:
            return f"database {db!r}: a Redis Cluster has database 0 only"
    return None


def redis_options(key: str, value: Any) -> dict[str, Any]:
    """The store client's options: ``master_name``, ``sentinel_kwargs``, ``cluster``."""
    if not isinstance(value, dict):
        raise reject(key, "a dict", value)
    known = ("master_name", "sentinel_kwargs", "cluster")
    for name, option in value.items():
        if name not in known:
            raise ImproperlyConfigured(f"{key}: unknown option {name!r} (known: {known})")
        if name == "master_name" and (not isinstance(option, str) or not option):
            raise reject(f"{key}['master_name']", "a non-empty string", option)
        if name == "sentinel_kwargs" and not isinstance(option, dict):
            raise reject(f"{key}['sentinel_kwargs']", "a dict", option)
        if name == "cluster" and not isinstance(option, bool):
            raise reject(f"{key}['cluster']", "True or False", option)
    return dict(value)


REDIS_URL: Setting[str | None] = Setting(
    "redis_url",
    None,
    optional(redis_url),
    "str | None",
    "Redis holding the shared store (durable revokes, global token buckets, per-item "
    "failure counts). ``None`` uses the broker when it is Redis, else the result backend "
    "when that is Redis; with neither, the features that need the store say so at start. "
    "``sentinel://host:port;sentinel://host:port/db`` for Redis behind Sentinel, "
    "``redis+cluster://host:port`` for a Redis Cluster (see :doc:`/store`).",
)
REDIS_OPTIONS: Setting[dict[str, Any]] = Setting(
    "redis_options",
    {},
    redis_options,
    "dict",
    "Options of the store's client: ``master_name`` (required with a Sentinel URL; when the "
    "store is the broker, ``broker_transport_options`` gives it too), ``sentinel_kwargs`` "
    "(options for the Sentinels themselves), ``cluster`` (``True``: a ``redis://`` URL names "
    "a Redis Cluster node).",
)
KEY_PREFIX: Setting[str] = Setting(
    "key_prefix",
    "celery-extras",
    text,
    "str",
    "Prefix of every key celery-extras writes to the shared store; give two apps that "
    "share one Redis different prefixes.",
)
STORE_ALLOW_EVICTION: Setting[bool] = Setting(
    "store_allow_eviction",
    False,
    boolean,
    "bool",
    "Park tasks in the store even when its Redis may evict them (a ``maxmemory-policy`` "
    "other than ``noeviction``; see :doc:`/store`). ``False``: such a store is reported "
    "at worker start, in ``inspect stats``, Prometheus and Flower, and nothing is parked "
    "there (waits stay held in the worker or unacked).",
)
#: The longest ``extras_store_timeout`` may be: the worker's loop waits that long at most.
MAX_STORE_TIMEOUT = 5.0


def store_timeout(key: str, value: Any) -> float:
    """Seconds, above 0 and at most :data:`MAX_STORE_TIMEOUT`."""
    if not is_number(value, None, 0.0) or float(value) > MAX_STORE_TIMEOUT:
        raise reject(key, f"a number of seconds > 0 and <= {MAX_STORE_TIMEOUT:g}", value)
    return float(value)


STORE_TIMEOUT: Setting[float] = Setting(
    "store_timeout",
    0.25,
    store_timeout,
    "float",
    "Longest the worker's event loop waits for one store call (a gate's admission, a park, "
    "a release), seconds. A call that times out, or a refused connection, stops every "
    "user of the store in the process from asking it again for "
    "``extras_store_retry`` seconds: gated tasks wait meanwhile (held or unacked), "
    "everything else goes on at its pace. Background work (the delay mover, revoke sync) "
    "waits longer (2 s, or this when longer).",
)
STORE_RETRY: Setting[float] = Setting(
    "store_retry",
    1.0,
    number(above=0),
    "float",
    "Seconds between attempts to reach the store after a call could not (a timeout, a "
    "refused connection): nobody in the process asks it in between, so an outage does not "
    "slow every task by a timeout. Formerly ``extras_limit_store_retry``.",
    formerly=("limit_store_retry",),
)
CORE_SETTINGS: tuple[Setting[Any], ...] = (
    REDIS_URL,
    REDIS_OPTIONS,
    KEY_PREFIX,
    STORE_ALLOW_EVICTION,
    STORE_TIMEOUT,
    STORE_RETRY,
)


def _match_case(key: str, like: str) -> str:
    """*key* in upper case when *like* is (Celery's ``match_case``: ``CELERY_`` keys)."""
    return key.upper() if like.isupper() else key.lower()


def conf_key(setting: Setting[Any], namespace: str | None) -> str:
    """The key of *setting* an app with *namespace* reads first (``CELERY_EXTRAS_...``)."""
    return _spellings(setting, namespace)[0]


def _spellings(setting: Setting[Any], namespace: str | None) -> tuple[str, ...]:
    """The keys *setting* may be given under, in the order Celery looks them up: its name,
    then its former names (deprecated)."""
    keys = (setting.key, *(PREFIX + name for name in setting.formerly))
    return tuple(spelling for key in keys for spelling in _namespaced(key, namespace))


def _namespaced(key: str, namespace: str | None) -> tuple[str, ...]:
    """*key* as an app with *namespace* may be given it, in the order Celery looks it up."""
    if not namespace:
        return (key,)
    prefix = namespace.rstrip("_") + "_"
    return (_match_case(prefix + key, prefix), key)


def deprecated_name(key: str, setting: Setting[Any]) -> None:
    """Warn that *key*, a former name of *setting*, still works, naming the new one."""
    warnings.warn(
        f"{key} is deprecated: use {setting.key} (the old name is read until celery-extras 0.3)",
        FutureWarning,
        stacklevel=3,
    )


def _is_extras_key(key: object, namespace: str | None) -> bool:
    if not isinstance(key, str):
        return False
    if key.startswith(PREFIX):
        return True
    if not namespace:
        return False
    return key.upper().startswith(namespace.rstrip("_").upper() + "_" + PREFIX.upper())


def validate(
    conf: Mapping[str, Any], settings: Iterable[Setting[Any]], namespace: str | None = None
) -> dict[str, Any]:
    """Check every ``extras_*`` key of *conf*; return ``{name: value}`` with defaults filled in.

    Raises :class:`ImproperlyConfigured` for an unknown ``extras_*`` key (with the
    closest known name) or for a value its setting rejects. With a *namespace*
    (``app.config_from_object(..., namespace="CELERY")``), ``CELERY_EXTRAS_*`` keys
    are checked the same way and errors name them as written.
    """
    settings = tuple(settings)
    known = {key: s for s in settings for key in _spellings(s, namespace)}
    for key in conf:
        if _is_extras_key(key, namespace) and key not in known:
            style = [k for k in known if k.isupper() == key.isupper()] or list(known)
            close = difflib.get_close_matches(key, style, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ImproperlyConfigured(f"{key}: unknown celery-extras setting{hint}")
    values: dict[str, Any] = {}
    for setting in settings:
        for key in _spellings(setting, namespace):
            if key in conf:
                values[setting.name] = setting.check(key, conf[key])
                if key not in _namespaced(setting.key, namespace):
                    deprecated_name(key, setting)
                break
        else:
            values[setting.name] = setting.check(setting.key, setting.default)
    return values


class ExtrasSettings(Mapping[str, Any]):
    """The validated celery-extras settings of one app: read-only, defaults filled in.

    ``settings["stats_interval"]`` gives a value by name (without the prefix);
    ``settings[STATS_INTERVAL]`` (a :class:`Setting`) gives it typed. Returned by
    :func:`settings_of`, which validates an app's settings once and hands the same
    object out until an ``extras_*`` value of the app changes.
    """

    __slots__ = ("_values",)
    _values: dict[str, Any]

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))

    @overload
    def __getitem__(self, key: Setting[T]) -> T: ...
    @overload
    def __getitem__(self, key: str) -> Any: ...
    def __getitem__(self, key: Setting[Any] | str) -> Any:
        return self._values[key.name if isinstance(key, Setting) else key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ExtrasSettings is read-only (setting {name!r})")

    def __repr__(self) -> str:
        return f"ExtrasSettings({self._values!r})"


_declared: weakref.WeakKeyDictionary[Celery, tuple[Setting[Any], ...]] = weakref.WeakKeyDictionary()
_validated: weakref.WeakKeyDictionary[
    Celery, tuple[tuple[Setting[Any], ...], dict[str, Any], ExtrasSettings]
] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def declare(app: Celery, settings: Iterable[Setting[Any]]) -> None:
    """Make *settings* the ones *app* accepts (``install(app)`` declares every capability's)."""
    with _lock:
        _declared[app] = tuple(settings)


def declared_settings(app: Celery) -> tuple[Setting[Any], ...]:
    """Every setting *app* accepts: the core ones, then each capability's (empty: not installed)."""
    return _declared.get(app, ())


def _given(app: Celery) -> dict[str, Any]:
    """The ``extras_*`` keys of *app*'s configuration, as given."""
    namespace = app.namespace
    conf = app.conf
    return {key: conf[key] for key in conf if _is_extras_key(key, namespace)}


def _snapshot(given: dict[str, Any]) -> dict[str, Any]:
    try:
        return copy.deepcopy(given)
    except Exception:  # a value that cannot be copied: compare it as it is
        return dict(given)


def settings_of(app: Celery) -> ExtrasSettings:
    """The app's validated celery-extras settings (see :class:`ExtrasSettings`).

    Validated once per app; validated again only when an ``extras_*`` value of the
    app changed since (``install(app, **options)``, ``app.conf.update(...)``).
    Raises :class:`ImproperlyConfigured` naming a bad setting, or when celery-extras
    is not installed on *app*.
    """
    declared = _declared.get(app)
    if declared is None:
        raise ImproperlyConfigured(
            f"celery-extras is not installed on {app!r}: call celery_extras.install(app)"
        )
    given = _given(app)
    cached = _validated.get(app)
    if cached is not None and cached[0] is declared:
        try:
            same = cached[1] == given
        except Exception:  # a value that cannot be compared: validate again
            same = False
        if same:
            return cached[2]
    settings = ExtrasSettings(validate(app.conf, declared, app.namespace))
    with _lock:
        _validated[app] = (declared, _snapshot(given), settings)
    return settings
