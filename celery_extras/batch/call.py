"""One call of a batched task: what the task function receives, a list of them a batch.

No Celery import: a call is plain data (its message's id, arguments, headers and the
request fields celery-batches' ``SimpleRequest`` has), made in the worker's main process
and handed to the pool process that runs the batch. :meth:`Call.retry` is an item a batch
returns to retry that call alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["Call", "CallRetry"]


@dataclass(frozen=True)
class CallRetry:
    """What :meth:`Call.retry` returns: as a call's item of a batch's list, that call alone
    is retried, as its own message (``self.retry()`` for one call)."""

    countdown: float | None = None
    eta: datetime | None = None
    exc: BaseException | None = None
    max_retries: int | None = None

    @property
    def when(self) -> float | datetime | None:
        """The retry's ``eta`` when given, else its ``countdown``."""
        return self.eta if self.eta is not None else self.countdown


@dataclass(frozen=True)
class Call:
    """One message of a batch: its task *id*, *args*, *kwargs* and *headers* (the message's
    own, under task protocols 1 and 2), and the request fields users of celery-batches read:
    the task's *name*, *delivery_info*, the worker's *hostname*, *reply_to*,
    *correlation_id*, *retries*, *eta* and *expires* (ISO 8601 text, or ``None``) and
    *ignore_result*."""

    id: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None
    delivery_info: Mapping[str, Any] = field(default_factory=dict)
    hostname: str | None = None
    reply_to: str | None = None
    correlation_id: str | None = None
    retries: int = 0
    eta: str | None = None
    expires: str | None = None
    ignore_result: bool = False

    @property
    def request_dict(self) -> dict[str, Any]:
        """The call's request as celery-batches' ``SimpleRequest.request_dict`` has it: its
        headers, arguments and the fields above, in one dict."""
        return {
            **self.headers, "id": self.id, "task": self.name, "args": list(self.args),
            "kwargs": dict(self.kwargs), "delivery_info": dict(self.delivery_info),
            "hostname": self.hostname, "reply_to": self.reply_to,
            "correlation_id": self.correlation_id, "retries": self.retries, "eta": self.eta,
            "expires": self.expires, "ignore_result": self.ignore_result,
        }  # fmt: skip

    @staticmethod
    def retry(
        countdown: float | None = None,
        exc: BaseException | None = None,
        *,
        eta: datetime | None = None,
        max_retries: int | None = None,
    ) -> CallRetry:
        """An item that retries its call alone (the batch's other calls end with their own
        items): ``return [1, Call.retry(countdown=5, exc=err), 3]``. As ``self.retry()``
        for that call: its own message again (same id, one more retry, its callbacks kept)
        after *countdown* seconds or at *eta*; it fails with *exc* (or
        ``MaxRetriesExceededError``) once it has had *max_retries* (default: the task's)."""
        return CallRetry(countdown, eta, exc, max_retries)
