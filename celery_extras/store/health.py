"""Whether the store answers, and its outages logged once, the same way for every user.

No Celery import. :class:`StoreHealth` is one per app and process, the breaker every user
of the store shares; each user (a gate, the delay store, the sync thread, the retry
failure memory) reports its calls through a :class:`StoreUser`, which backs off after a
failure. An outage that fails a thousand tasks writes one line for the process when it
starts (what it means for each user) and one when it ends, with Redis' own text.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from ..bounds import cut

logger = logging.getLogger("celery_extras.store")

__all__ = [
    "UNREACHABLE",
    "OutageLog",
    "StoreHealth",
    "StoreUnavailable",
    "StoreUser",
    "answered_with_error",
    "may_have_been_done",
    "store_text",
]


def store_text(exc: BaseException, limit: int = 300) -> str:
    """*exc* as the store said it (Redis' error text kept), cut to a log line."""
    return f"{type(exc).__name__}: {cut(str(exc), limit)}"


class OutageLog:
    """Whether store calls fail now, since when, and why; logs the transitions of an outage
    (*what* names the user in the lines; ``""``: the store itself, for a whole process)."""

    def __init__(
        self, logger: logging.Logger, what: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.logger = logger
        self.what = what  # e.g. "retry failure memory"
        self.clock = clock
        self.down = False
        self.quiet = False  # the outage is logged elsewhere (the process' own line)
        self.reason = ""
        self.since = 0.0
        self.failures = 0
        self._lock = threading.Lock()

    @property
    def subject(self) -> str:
        return f"{self.what}: " if self.what else ""

    def failed(self, exc: BaseException, consequence: str, quiet: bool = False) -> bool:
        """Note a failed call; log it if it starts an outage (then ``True``), unless
        *quiet* (the outage is logged elsewhere: its end is quiet too)."""
        with self._lock:
            self.failures += 1
            self.reason = store_text(exc)
            if self.down:
                return False
            self.down, self.quiet, self.since = True, quiet, self.clock()
        if not quiet:
            self.logger.error(
                "celery-extras: %sthe store failed (%s); %s (logged once per outage)",
                self.subject, self.reason, consequence,
            )  # fmt: skip
        return True

    def ok(self) -> None:
        """Note a good call; log the end of an outage."""
        if not self.down:
            return
        with self._lock:
            if not self.down:
                return
            self.down = False
            lasted = self.clock() - self.since
            failures, self.failures = self.failures, 0
        if not self.quiet:
            self.logger.warning(
                "celery-extras: %sthe store answers again after %.1f s (%d failed calls)",
                self.subject, lasted, failures,
            )  # fmt: skip


class StoreUnavailable(RuntimeError):
    """No Redis is configured for the shared store."""


#: Errors meaning the store could not be reached: every user of it backs off.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError, StoreUnavailable)


def answered_with_error(exc: BaseException) -> bool:
    """``True`` unless *exc* says the store could not be reached: the store answered (a
    script error, a key of the wrong type, a write refused for memory, a reply this
    version cannot read), so only the call's own user backs off."""
    return not isinstance(exc, UNREACHABLE)


def may_have_been_done(exc: BaseException) -> bool:
    """Whether a call that failed with *exc* may still have been done by the store: it timed
    out, or its connection broke once it was sent (its bytes may arrive later); not when the
    store refused the connection, or answered with an error."""
    if isinstance(exc, redis.ConnectionError) and " connecting to " in str(exc):
        return False  # redis-py's "Error 111 connecting to host:port": nothing was sent
    return isinstance(exc, redis.TimeoutError | redis.ConnectionError)


class StoreHealth:
    """Whether the store answers, for every user of it in one process: its breaker.

    A user (a gate, the delay store, the sync thread...) reports each call's outcome
    through its :class:`StoreUser`. One call that cannot reach the store (a timeout, a
    refused connection) opens the breaker: nobody in the process asks the store again for
    *retry* seconds, so an outage costs the worker's loop one short timeout per *retry*,
    not one per user and task, and it is logged once for the process, with what it means
    for each user. A store that answered one user with an error backs off that user only,
    and that user logs it.
    """

    def __init__(
        self,
        retry: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = logger,
    ) -> None:
        self.retry = retry
        self.clock = clock
        self.unreachable_until = 0.0
        self.last_error: BaseException | None = None
        self.users: dict[str, StoreUser] = {}
        self.outage = OutageLog(logger, "", clock)

    def user(self, logger: logging.Logger, what: str, consequence: str) -> StoreUser:
        """The user *what* (one per name: ``"global limits"``), created on first use."""
        user = self.users.get(what)
        if user is None:
            user = self.users[what] = StoreUser(self, logger, what, consequence)
        return user

    def reachable(self) -> bool:
        return self.clock() >= self.unreachable_until

    def unreachable(
        self, exc: BaseException, by: StoreUser | None = None, consequence: str = ""
    ) -> None:
        """A call (of *by*, meaning *consequence* for it) could not reach the store: open the
        breaker for :attr:`retry` seconds; the line that starts an outage says what it means
        for every user."""
        self.last_error = exc
        self.unreachable_until = self.clock() + self.retry
        consequences = "; ".join(
            f"{u.log.what}: {consequence if u is by and consequence else u.consequence}"
            for u in self.users.values()
        )
        self.outage.failed(exc, consequences or "its users wait")

    def answered(self) -> None:
        self.unreachable_until = 0.0
        self.outage.ok()


class StoreUser:
    """One user's view of the store: its own back-off and :class:`OutageLog` (for the errors
    the store answers it with; an unreachable store is the process' :class:`StoreHealth`'s
    to log)."""

    def __init__(
        self, health: StoreHealth, logger: logging.Logger, what: str, consequence: str
    ) -> None:
        self.health = health
        self.consequence = consequence
        self.log = OutageLog(logger, what, health.clock)
        self.until = 0.0
        self.errors = 0

    @property
    def down(self) -> bool:
        return self.log.down

    @property
    def reason(self) -> str:
        return self.log.reason

    def up(self) -> bool:
        """``False`` while this user, or the store for everyone, is backing off."""
        health = self.health
        if health.clock() < self.until:
            return False
        if health.reachable():
            return True
        if not self.log.down and health.last_error is not None:  # learnt from another user
            self.log.failed(health.last_error, self.consequence, quiet=True)
        return False

    def failed(self, exc: BaseException, consequence: str | None = None) -> bool:
        """Note a failed call and back off: an unreachable store opens the process' breaker
        (logged there, once), an error answered is logged here; ``True`` when it starts this
        user's outage."""
        self.errors += 1
        health = self.health
        self.until = health.clock() + health.retry
        unreachable = not answered_with_error(exc)
        if unreachable:
            health.unreachable(exc, self, consequence or self.consequence)
        return self.log.failed(exc, consequence or self.consequence, quiet=unreachable)

    def answered(self) -> None:
        """Note a good call: the outage (if any) ends, for this user and the store."""
        self.health.answered()
        self.log.ok()

    def info(self) -> dict[str, Any]:
        return {"store": "down" if self.down else "ok",
                **({"store_error": self.reason} if self.down else {})}  # fmt: skip
