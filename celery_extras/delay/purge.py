"""Purging the delay store with the broker: ``celery purge``, ``app.control.purge()``,
``celery extras delayed --drop``.

A parked task has left the broker: its message was acked once the store had it. Purging
a queue must drop it too, or it runs later, as if the purge had missed it. So
:func:`purge_parked`, called once the broker's queues are emptied, drops what the store
holds for the same queues, in every shard and layout (one script call per page of a
shard), then empties their due queues: an entry claimed or released at that moment is
dropped too, its tombstone making any copy already published (in a due queue, or in a
worker's prefetch) a ``PURGED`` message that the worker receiving it drops.

Which entries: those recording one of the queues (the queue the worker that parked the
message consumed it from). An entry recording none (its route named no queue that worker
consumed: a topic or fanout binding, say) is dropped only when its route certainly leads
to purged queues alone: the default exchange and a purged queue's name, or a direct
exchange and routing key with which, of the queues the app declares, only purged ones are
bound. Any other is kept and counted (:attr:`~.store.Purged.kept`): nothing is dropped
that may belong to a queue not purged. ``--drop`` (:func:`drop_delayed`) drops a task
name's entries whatever their queue.

``celery purge`` is Celery's command, which the ``celery.commands`` entry point's import
extends (:func:`celery_extras.cli.purge_parked_too`, through
:func:`celery_extras.compat.after_purge_command`); ``app.control.purge()`` is extended by
:class:`PurgingControl`, which ``install(app)`` puts on top of the app's control class.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from celery.app.control import Control
from kombu.entity import Queue

from .. import compat
from ..settings import declared_settings, settings_of
from ..store.client import store_url
from .entry import DUE_SUFFIX, due_queue_name
from .parking import STORE_ERRORS, Parker
from .store import DelayStore, Purged, Selection

__all__ = [
    "MAX_TASK_NAME",
    "ParkedNotPurged",
    "ParkedPurge",
    "PurgingControl",
    "connect",
    "drop_delayed",
    "purge_parked",
    "purges_parked",
    "queue_selection",
]

#: Longest task name ``--drop`` takes (a longer one is a mistake, not a task).
MAX_TASK_NAME = 1000


class ParkedNotPurged(RuntimeError):
    """The broker's queues were emptied, but the delay store could not drop what it holds
    for them (it did not answer): those parked tasks still run."""


@dataclass(frozen=True)
class ParkedPurge:
    """What :func:`purge_parked` did: the store's :class:`~.store.Purged` counts, and the
    messages emptied from the due queues (copies of the entries counted there)."""

    purged: Purged = field(default_factory=Purged)
    due_messages: int = 0

    @property
    def dropped(self) -> int:
        """Parked tasks that will not run: parked, or on their way."""
        return self.purged.dropped


def _bindings(queue: Queue) -> Iterator[tuple[str, str, str]]:
    """``(exchange, exchange type, routing key)`` of each binding *queue* declares."""
    if queue.exchange is not None:
        yield queue.exchange.name or "", queue.exchange.type or "direct", queue.routing_key or ""
    for binding in queue.bindings or ():
        exchange = binding.exchange
        if exchange is not None:
            yield exchange.name or "", exchange.type or "direct", binding.routing_key or ""


def queue_selection(declared: Iterable[Queue], names: Iterable[str]) -> Selection:
    """The entries to drop when the queues *names* are purged, among the queues the app
    declares (*declared*): those recording one of *names*; those recording none whose route
    certainly reaches purged queues alone (see the module's text)."""
    purged = {name for name in names if name and not name.endswith(DUE_SUFFIX)}
    reached: dict[tuple[str, str], set[str]] = {}
    unsure: set[str] = set()  # exchanges routing otherwise than by the exact key
    for queue in declared:
        for exchange, kind, key in _bindings(queue):
            if not exchange:
                continue  # the default exchange routes by the queue's name: below
            if kind == "direct":
                reached.setdefault((exchange, key), set()).add(queue.name)
            else:
                unsure.add(exchange)
    routes = {route for route, queues in reached.items()
              if queues <= purged and route[0] not in unsure}  # fmt: skip
    routes |= {("", name) for name in purged}
    return Selection(queues=frozenset(purged), routes=frozenset(routes))


def purges_parked(app: Celery) -> bool:
    """Whether a purge of *app*'s queues drops parked tasks too: celery-extras is installed
    on it and it has a store (else nothing is parked anywhere)."""
    return bool(declared_settings(app)) and store_url(app) is not None


def _store(app: Celery) -> DelayStore:
    """*app*'s delay store through the store's background client (longer timeouts than the
    worker loop's: a purge reads every shard), with the app's shard layout."""
    return Parker(app, settings_of(app)["delay_tombstone_ttl"], background=True).store


def _empty_queue(connection: Any, name: str) -> int:
    """Empty the broker queue *name*; how many messages it held (0 where it does not exist).
    A channel of its own: RabbitMQ closes the channel that purged a queue it does not have."""
    channel = connection.channel()
    try:
        return int(channel.queue_purge(name) or 0)
    except connection.channel_errors:
        return 0
    finally:
        with contextlib.suppress(*connection.channel_errors, *connection.connection_errors):
            channel.close()


def purge_parked(app: Celery, names: Iterable[str], connection: Any = None) -> ParkedPurge:
    """After the broker's queues *names* were emptied: drop what the delay store holds for
    them, then empty their due queues (``<queue>.extras-due``). Store errors propagate as
    :class:`ParkedNotPurged` (the caller's broker purge stands)."""
    queues = sorted({name for name in names if name and not name.endswith(DUE_SUFFIX)})
    if not queues:
        return ParkedPurge()
    selection = queue_selection(app.amqp.queues.values(), queues)
    try:
        purged = _store(app).purge(selection)
    except STORE_ERRORS as exc:
        raise ParkedNotPurged(
            f"the delay store did not answer ({exc!r:.200}): the tasks parked for "
            f"{', '.join(queues)} were not purged and still run"
        ) from exc
    with app.connection_or_acquire(connection) as conn:
        due = sum(_empty_queue(conn, due_queue_name(queue)) for queue in queues)
    return ParkedPurge(purged, due)


def drop_delayed(app: Celery, task_name: str) -> int:
    """Drop every task named *task_name* that the delay store holds, whatever its queue:
    parked, or on its way (a copy already published is dropped by the worker that receives
    it). How many; :class:`ValueError` for a name that cannot be a task's (the store's own
    errors, ``redis.RedisError``, propagate). The sibling of :func:`~.capability.delayed`,
    which lists them."""
    if not isinstance(task_name, str) or not task_name.strip():
        raise ValueError(f"{task_name!r}: expected a task name")
    if len(task_name) > MAX_TASK_NAME:
        raise ValueError(f"{task_name[:40]!r}...: a task name of {len(task_name)} characters "
                         f"(at most {MAX_TASK_NAME})")  # fmt: skip
    return _store(app).purge(Selection(tasks=frozenset({task_name}))).dropped


class PurgingControl(Control):
    """A ``Control`` whose :meth:`purge` drops the tasks parked for the queues it empties too,
    and counts them; a mixin, put on top of the app's own control class."""

    def purge(self, connection: Any = None) -> int:
        """Celery's purge (the app's queues), then :func:`purge_parked` for the same queues:
        the broker's messages plus the parked tasks dropped. :class:`ParkedNotPurged` when
        the store does not answer."""
        app: Celery = self.app
        with app.connection_or_acquire(connection) as conn:
            messages = int(super().purge(conn) or 0)
            if not purges_parked(app):
                return messages
            return messages + purge_parked(app, compat.control_purge_queues(app), conn).dropped

    discard_all = purge


def connect(app: Celery) -> None:
    """``install(app)``: ``app.control.purge()`` drops parked tasks too (the app's control
    class, Celery's or another, gets :class:`PurgingControl` on top)."""
    compat.with_control_mixin(app, PurgingControl)
