"""Client side: ``app.control.revoke`` and ``revoke_by_stamped_headers`` also write the store.

After ``install(app)`` the app's :class:`~celery.app.control.Control` is a
subclass whose revoke methods first record the revoke in the durable store
(with its expiry), then broadcast it exactly as Celery does. A worker that is
down, starting, or partitioned when the broadcast goes out reads it from the
store. ``AsyncResult.revoke()`` goes through ``app.control.revoke``. A revoke
sent to some workers only (``destination=``) is not stored: it is not meant for
the whole cluster.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterable
from typing import Any, cast

import redis
from celery import Celery
from celery.app.control import Control
from celery.utils.log import get_logger

from ..bounds import shown
from ..settings import settings_of
from ..store.client import StoreUnavailable, redis_client, store_key
from .control import STORED_UNTIL
from .entries import Stamp, valid_id, valid_stamp
from .revoke_store import RevokeStore

__all__ = ["DurableRevokes", "install_client", "record_revokes"]

TERM_SIGNAME = "SIGTERM"  # billiard.common.TERM_SIGNAME, the default of Celery's revoke

logger = get_logger(__name__)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple | set | frozenset) else [value]


def _stamps_of(headers: Any) -> list[tuple[object, object]]:
    """``(header, value)`` pairs of Celery's ``headers`` argument (a dict, or ``["k=v", ...]``)."""
    if isinstance(headers, list | tuple):
        # as Celery's worker reads them: "k=v" -> {k: v} ("k=v=w" too gives v)
        headers = {
            h.split("=")[0]: h.split("=")[1] for h in headers if isinstance(h, str) and "=" in h
        }
    if not isinstance(headers, dict):
        return []
    return [(h, v) for h, values in headers.items() for v in _as_list(values)]


def record_revokes(
    app: Celery,
    ids: Iterable[object] = (),
    stamps: Iterable[tuple[object, object]] = (),
    expires: float | None = None,
) -> int:
    """Write revokes to the app's store, each living *expires* seconds (default the setting).

    Returns how many entries changed. Invalid ids or stamps raise :class:`ValueError`
    naming them; the store being unreachable raises :class:`redis.RedisError`.
    """
    return _store(app, ids, stamps, expires)[0]


def _store(
    app: Celery,
    ids: Iterable[object],
    stamps: Iterable[tuple[object, object]],
    expires: float | None,
) -> tuple[int, float]:
    """:func:`record_revokes`, also returning the Unix time until which the store holds them."""
    settings = settings_of(app)
    life = settings["revoke_expires"] if expires is None else float(expires)
    if not life > 0:
        raise ValueError(f"revoke expires {expires!r}: expected a number of seconds > 0")
    ids, stamps = list(ids), list(stamps)
    bad = [shown(i) for i in ids if not valid_id(i)]
    bad += [shown(s) for s in stamps if not valid_stamp(*s)]
    if bad:
        raise ValueError(f"cannot store revokes of {', '.join(bad)}: expected task ids "
                         f"(strings of 1-255 characters) and scalar stamps")  # fmt: skip
    expires_at = time.time() + life
    store = RevokeStore(redis_client(app, background=True), store_key(app), settings["revoke_max"])
    valid_stamps: dict[Stamp, float] = {(str(h), v): expires_at for h, v in stamps}  # type: ignore[misc]
    changed = store.add({str(i): expires_at for i in ids}, valid_stamps, clock=app.clock.forward())
    return changed, expires_at


class DurableRevokes(Control):
    """Celery's Control whose revokes are also written to the durable store."""

    def _record(
        self,
        ids: list[Any],
        stamps: list[tuple[object, object]],
        destination: Any,
        expires: float | None,
    ) -> float | None:
        """Store the revokes; return until when the store holds them (``None``: not stored)."""
        if destination is not None or not settings_of(self.app)["sync_enabled"]:
            return None
        try:
            return _store(self.app, ids, stamps, expires)[1]
        except (StoreUnavailable, redis.RedisError, ValueError) as exc:
            logger.warning(
                "celery-extras: revoke of %s not stored (only broadcast to live workers): %s",
                ", ".join(map(str, [*ids, *stamps]))[:200], exc,
            )  # fmt: skip
            return None

    def revoke(
        self,
        task_id: Any,
        destination: Any = None,
        terminate: bool = False,
        signal: str = TERM_SIGNAME,
        **kwargs: Any,
    ) -> Any:
        """Celery's revoke, stored first; ``revoke_expires=`` sets this revoke's lifetime (s).

        A stored revoke's broadcast says until when the store holds it
        (:data:`~.control.STORED_UNTIL`), so the workers never write it back.
        """
        expires = kwargs.pop("revoke_expires", None)
        stored_until = self._record(_as_list(task_id), [], destination, expires)
        if stored_until is None:
            return super().revoke(task_id, destination, terminate, signal, **kwargs)
        arguments = {"task_id": task_id, "terminate": terminate, "signal": signal,
                     STORED_UNTIL: stored_until}  # fmt: skip
        return self.broadcast("revoke", destination=destination, arguments=arguments, **kwargs)

    def revoke_by_stamped_headers(
        self,
        headers: Any,
        destination: Any = None,
        terminate: bool = False,
        signal: str = TERM_SIGNAME,
        **kwargs: Any,
    ) -> Any:
        """Celery's revoke by stamped headers, stored first."""
        expires = kwargs.pop("revoke_expires", None)
        self._record([], _stamps_of(headers), destination, expires)
        return super().revoke_by_stamped_headers(headers, destination, terminate, signal, **kwargs)


def install_client(app: Celery) -> None:
    """Make ``app.control`` store revokes, whether or not it was already created."""
    current = app.__dict__.get("control")
    if current is not None:
        if not isinstance(current, DurableRevokes):
            current.__class__ = _durable(type(current))
        return
    app.control_cls = _durable(_resolve(app.control_cls))


def _resolve(name: Any) -> type[Any]:
    """The class named like Celery's ``control_cls`` (``"module:Class"`` or ``"module.Class"``)."""
    if not isinstance(name, str):
        return cast(type[Any], name)
    module, sep, attr = name.partition(":")
    if not sep:
        module, _, attr = name.rpartition(".")
    return cast(type[Any], getattr(importlib.import_module(module), attr))


def _durable(base: type[Any]) -> type[Any]:
    if issubclass(base, DurableRevokes):
        return base
    if base is Control:
        return DurableRevokes
    return type(f"Durable{base.__name__}", (DurableRevokes, base), {})
