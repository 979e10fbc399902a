"""The coalescing runs of one worker: their holds in the store, renewed every third of
their lease while the run goes on, and stepped aside from when it leaves the worker."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..admission.gate import Ticket
from ..admission.notices import Bucket
from .holds import Holds

__all__ = ["CoalesceHolding", "RunHolds"]

logger = logging.getLogger("celery_extras.coalesce")


@dataclass
class CoalesceHolding:
    """A hold of this worker: the run (or waiting run) of *bucket* under *holder*."""

    bucket: Bucket
    holder: str
    lease: float
    #: when it was last asked for (or renewed), and when to ask again (monotonic clock)
    asked: float
    next_ask: float = 0.0
    #: a waiting run: when it started to wait here, and the seconds left of the run's lease
    since: float = 0.0
    run_due: float = 0.0
    #: a run whose hold ran out before renewal (another run of its key may have started)
    lost: bool = False


def _renewals_due(
    holdings: Iterable[tuple[Ticket, CoalesceHolding]], now: float
) -> dict[tuple[Bucket, str, float], list[str]]:
    """The runs whose hold is due for renewal (every third of its lease), by bucket and
    holder; each is marked renewed now."""
    due: dict[tuple[Bucket, str, float], list[str]] = {}
    for ticket, holding in holdings:
        if not holding.lost and now - holding.asked >= holding.lease / 3:
            due.setdefault((holding.bucket, holding.holder, holding.lease), []).append(
                ticket.request.id
            )
            holding.asked = now
    return due


class RunHolds:
    """The runs this worker holds a key for, by ``id(request)``."""

    def __init__(self, holds: Holds) -> None:
        self.holds = holds
        self.runs: dict[int, tuple[Ticket, CoalesceHolding]] = {}
        self.lost = 0

    def add(self, ticket: Ticket, holding: CoalesceHolding) -> None:
        self.runs[id(ticket.request)] = (ticket, holding)

    def pop(self, ticket: Ticket) -> CoalesceHolding | None:
        found = self.runs.pop(id(ticket.request), None)
        return found[1] if found is not None else None

    def step_aside(self, ticket: Ticket, holding: CoalesceHolding, seconds: float) -> None:
        """The run leaves this worker (a retry, parked, a lost connection): its key stays
        held *seconds* more for whoever runs it next."""
        self.holds.step_aside(holding.bucket, ticket.request.id, holding.holder,
                        seconds, holding.lease)  # fmt: skip

    def renew(self, now: float) -> None:
        """Renew the holds due; a hold that ran out before renewal is lost (logged)."""
        for (bucket, holder, lease), ids in _renewals_due(self.runs.values(), now).items():
            lost = self.holds.renew(bucket, ids, holder, lease)
            if not lost:
                continue
            for _, holding in self.runs.values():
                if holding.holder == holder:
                    holding.lost = True  # renewed no more: its end frees nothing
            self.lost += len(lost)
            logger.error(
                "celery-extras: the coalescing hold of %s ran past its lease (%.0f s) "
                "before renewal (the worker was blocked or cut off from the store); "
                "another run of its key may start",
                bucket[0], lease,
            )  # fmt: skip

    def drop_unadmitted(self, admitted: Any) -> None:
        """The connection is lost: runs that had not reached the pool keep their hold for
        whoever receives them next; those running keep theirs until they end."""
        for key, (ticket, holding) in list(self.runs.items()):
            if key not in admitted:
                del self.runs[key]
                self.step_aside(ticket, holding, 0.0)

    def running(self) -> Iterable[CoalesceHolding]:
        return (holding for _, holding in self.runs.values())
