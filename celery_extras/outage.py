"""Store failures logged once per outage, per process and capability, with Redis' own text.

Pure (standard ``logging`` only). A capability keeps one :class:`OutageLog`; every
failed store call reports to it and every good one clears it, so an outage that fails
a thousand tasks writes one line when it starts and one when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .bounds import cut

__all__ = ["OutageLog", "store_text"]


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
