"""Whether the store answers, and its outages logged once, the same way for every user.

No Celery import. :class:`StoreHealth` is one per app and process; each user of the
store (a gate, the delay store, the sync thread, the retry failure memory) reports
its calls through a :class:`StoreUser`, which backs off after a failure and keeps an
:class:`OutageLog`: an outage that fails a thousand tasks writes one line per user
when it starts and one when it ends, with Redis' own text.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from ..bounds import cut

__all__ = [
    "UNREACHABLE",
    "OutageLog",
    "StoreHealth",
    "StoreUnavailable",
    "StoreUser",
    "answered_with_error",
    "store_text",
]


def store_text(exc: BaseException, limit: int = 300) -> str:
    """*exc* as the store said it (Redis' error text kept), cut to a log line."""
    return f"{type(exc).__name__}: {cut(str(exc), limit)}"


class OutageLog:
    """Whether a capability's store calls fail now, since when, and why; logs transitions."""

    def __init__(
        self, logger: logging.Logger, what: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.logger = logger
        self.what = what  # e.g. "retry failure memory"
        self.clock = clock
        self.down = False
        self.reason = ""
        self.since = 0.0
        self.failures = 0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException, consequence: str) -> bool:
        """Note a failed call; log it if it starts an outage (then ``True``)."""
        with self._lock:
            self.failures += 1
            self.reason = store_text(exc)
            if self.down:
                return False
            self.down, self.since = True, self.clock()
        self.logger.error(
            "celery-extras: %s: the store failed (%s); %s (logged once per outage)",
            self.what, self.reason, consequence,
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
        self.logger.warning(
            "celery-extras: %s: the store answers again after %.1f s (%d failed calls)",
            self.what, lasted, failures,
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


class StoreHealth:
    """Whether the store answers, for every user of it in one process.

    A user (a gate, the delay store, the sync thread...) reports each call's outcome
    through its :class:`StoreUser`. A store that cannot be reached is not asked again by
    anyone for *retry* seconds (so an outage does not cost every task a timeout); a store
    that answered one user with an error backs off that user only.
    """

    def __init__(self, retry: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.retry = retry
        self.clock = clock
        self.unreachable_until = 0.0
        self.last_error: BaseException | None = None
        self.users: dict[str, StoreUser] = {}

    def user(self, logger: logging.Logger, what: str, consequence: str) -> StoreUser:
        """The user *what* (one per name: ``"global limits"``), created on first use."""
        user = self.users.get(what)
        if user is None:
            user = self.users[what] = StoreUser(self, logger, what, consequence)
        return user

    def reachable(self) -> bool:
        return self.clock() >= self.unreachable_until

    def unreachable(self, exc: BaseException) -> None:
        self.last_error = exc
        self.unreachable_until = self.clock() + self.retry

    def answered(self) -> None:
        self.unreachable_until = 0.0


class StoreUser:
    """One user's view of the store: its own back-off and :class:`OutageLog`, so each user
    logs once per outage what the outage does to it, and once when it ends."""

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
        if not self.log.down and health.last_error is not None:
            self.log.failed(health.last_error, self.consequence)  # learnt from another user
        return False

    def failed(self, exc: BaseException, consequence: str | None = None) -> bool:
        """Note a failed call (logged if it starts an outage, then ``True``); back off."""
        self.errors += 1
        health = self.health
        self.until = health.clock() + health.retry
        if not answered_with_error(exc):
            health.unreachable(exc)
        return self.log.failed(exc, consequence or self.consequence)

    def answered(self) -> None:
        """Note a good call: the outage (if any) ends, for this user and the store."""
        self.health.answered()
        self.log.ok()

    def info(self) -> dict[str, Any]:
        return {"store": "down" if self.down else "ok",
                **({"store_error": self.reason} if self.down else {})}  # fmt: skip
