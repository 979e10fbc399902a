"""What a policy that holds a key for its run (coalescing, debounce, memoize) keeps in the
worker: each hold, its lease renewed every third of the lease while the run goes on, and how
the run's end reaches the messages it covered (the outcome the worker saw, each covered
message with its stored context).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from celery import Celery, states
from celery.exceptions import TaskRevokedError

from .. import compat
from ..admission.covered import CoveredMessage, Outcome, decode_context
from ..admission.gate import Ticket
from ..admission.notices import Bucket, ReleaseNotices
from ..admission.spec import call_key
from ..store.client import redis_client, store_key, store_safety, store_url
from ..store.health import StoreUser
from ..store.safety import COALESCING

__all__ = [
    "Covering",
    "KeyHolding",
    "KeyHolds",
    "covered_messages",
    "discarded_key",
    "known_outcome",
    "renew_due",
    "revoked_outcome",
]

logger = logging.getLogger("celery_extras.keyed")

S = TypeVar("S")
R = TypeVar("R")

#: ``renew(bucket, ids, holder, lease)``: the ids whose hold had run out (not renewed).
Renew = Callable[[Bucket, list[str], str, float], Sequence[str] | None]


class KeyHolds(Generic[S]):
    """Where one worker's holds of a policy are (*S*: what answers for them), and the one
    way it calls them: the store's (``connect(client, prefix)``), shared by every worker,
    through the store's health, or with no store this worker's own table (*local*).

    A call answers ``None`` at once while the store is backing off after a failure, and a
    :meth:`claim` too while the store may evict the holds (:mod:`celery_extras.store.safety`):
    the gate then does what its ``on_store_error`` setting says. A hold's lease ends what a
    lost call would have ended."""

    def __init__(
        self, app: Celery, health: StoreUser, local: S, connect: Callable[[Any, str], S]
    ) -> None:
        self.app = app
        self.health = health
        self.safety = store_safety(app)
        #: the holds are the store's, shared by every worker (else this worker's table)
        self.shared = store_url(app) is not None
        self.local = local
        self._connect = connect
        self._store: S | None = None

    @property
    def store(self) -> S:
        if self._store is None:
            self._store = self._connect(redis_client(self.app), store_key(self.app))
        return self._store

    def claim(self, operation: Callable[[S], R]) -> R | None:
        """*operation* (it may take a hold) on the holds; ``None`` when the
        store cannot, or must not, answer."""
        if self.shared and self.safety.evicts(COALESCING):
            return None
        return self.call(operation)

    def call(self, operation: Callable[[S], R], now: bool = False) -> R | None:
        """``operation(holds)``; ``None`` when the store is away (*now*: asked even while
        this worker backs off from it, and ``None`` if it fails)."""
        if not self.shared:
            return operation(self.local)
        if not now and not self.health.up():
            return None
        return self.read(lambda: operation(self.store))

    def joins_rounds(self) -> bool:
        """Whether a call may go in a round now (:mod:`.store_round`): the holds are the
        store's, which may answer, and a :meth:`claim` would be made."""
        return self.shared and not self.safety.evicts(COALESCING) and self.health.up()

    def read(self, reading: Callable[[], R]) -> R | None:
        """*reading* (a store call, or of a round's reply to one) with the store's health
        told how it went: ``None`` when it failed."""
        try:
            answer = reading()
        except Exception as exc:
            self.health.failed(exc)
            return None
        self.health.answered()
        return answer

    def listen(self, notices: ReleaseNotices) -> None:
        """Have *notices* hear the runs that end with another waiting (shared holds only)."""
        if not self.shared or notices.listening:
            return
        try:
            notices.listen(self.store)  # type: ignore[arg-type]  # a NoticeSource
        except Exception as exc:
            self.health.failed(exc)


@dataclass
class KeyHolding:
    """A hold of this worker: the run (or a waiting message) of *bucket* under *holder*."""

    bucket: Bucket
    holder: str
    lease: float
    #: when it was last asked for (or renewed), and when to ask again (the gate's clock)
    asked: float
    next_ask: float = 0.0
    #: a waiting message: when it started to wait here
    since: float = 0.0
    #: a run whose hold ran out before renewal (another run of its key may have started)
    lost: bool = False


def renew_due(
    holdings: Iterable[tuple[Ticket, KeyHolding]], now: float, renew: Renew, policy: str
) -> int:
    """Renew the runs whose hold is due (every third of its lease; each marked renewed
    now), by bucket and holder: the number whose hold had run out (logged once per holder,
    and marked lost: renewed no more, their end frees nothing)."""
    holdings = list(holdings)
    due: dict[tuple[Bucket, str, float], list[str]] = {}
    for ticket, holding in holdings:
        if not holding.lost and now - holding.asked >= holding.lease / 3:
            due.setdefault((holding.bucket, holding.holder, holding.lease), []).append(
                ticket.request.id
            )
            holding.asked = now
    count = 0
    for (bucket, holder, lease), ids in due.items():
        lost = renew(bucket, ids, holder, lease)
        if not lost:
            continue
        for _, holding in holdings:
            if holding.holder == holder:
                holding.lost = True
        count += len(lost)
        logger.error(
            "celery-extras: the %s hold of %s ran past its lease (%.0f s) before renewal "
            "(the worker was blocked or cut off from the store); another run of its key "
            "may start",
            policy, bucket[0], lease,
        )  # fmt: skip
    return count


def revoked_outcome(run_id: str) -> Outcome:
    """The outcome of a run Celery discarded before it ran."""
    return Outcome(states.REVOKED, TaskRevokedError("revoked"), None, run_id)


def known_outcome(ticket: Ticket) -> Outcome:
    """The outcome of *ticket*'s run as the worker saw it (for a task that stores no
    result): its exception, else success (its return value stays in its pool process)."""
    run_id = ticket.request.id
    if isinstance(ticket.outcome, BaseException):
        return Outcome(states.FAILURE, ticket.outcome, None, run_id)
    if ticket.outcome is None and run_id in compat.worker_revoked():
        return revoked_outcome(run_id)
    if ticket.outcome is None:
        return Outcome(states.FAILURE, RuntimeError("the covering run ended unseen"), None, run_id)
    return Outcome(states.SUCCESS, None, None, run_id)


class Covering(Protocol):
    """A finished (or dropped) run's answer from its store: the ids it covered, with the
    ending context stored for each."""

    @property
    def covered(self) -> Sequence[str]: ...

    @property
    def contexts(self) -> Mapping[str, str]: ...


def covered_messages(done: Covering) -> list[CoveredMessage]:
    """The messages *done* covered, each with its stored ending context (``None``: its
    result only, as for an id whose holder had not confirmed it)."""
    return [CoveredMessage(one, decode_context(done.contexts.get(one), one))
            for one in done.covered]  # fmt: skip


def discarded_key(app: Celery, specs: Mapping[str, Any], sender: Any, request: Any,
                  policy: str) -> tuple[Bucket, str] | None:  # fmt: skip
    """``task_revoked`` (Celery discarded a message: revoked, expired): the key of *policy*
    (a spec of *specs*, with its ``key``) the message held and its id, when it is a task of
    *app* with the policy; else ``None``."""
    name = getattr(sender, "name", None)
    task_id = getattr(request, "id", None)
    if not isinstance(name, str) or name not in specs or getattr(sender, "app", None) is not app:
        return None
    if not isinstance(task_id, str):
        return None
    return (name, call_key(name, specs[name].key, request, policy, "key", logger)), task_id
