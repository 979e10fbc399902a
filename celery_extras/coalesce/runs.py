"""The coalescing runs of one worker: their holds in the store, renewed every third of
their lease while the run goes on, and stepped aside from when it leaves the worker."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..admission.gate import Ticket
from ..admission.key_runs import KeyHolding, renew_due
from .holds import Holds

__all__ = ["CoalesceHolding", "RunHolds"]


@dataclass
class CoalesceHolding(KeyHolding):
    """A hold of this worker: the run (or waiting run) of *bucket* under *holder*; a
    waiting run also knows the seconds left of the run's lease."""

    run_due: float = 0.0


class RunHolds:
    """The runs this worker holds a key for, by ``id(request)``."""

    def __init__(self, holds: Holds) -> None:
        self.holds = holds
        self.runs: dict[int, tuple[Ticket, CoalesceHolding]] = {}
        self.lost = 0

    def add(self, ticket: Ticket, holding: CoalesceHolding) -> None:
        self.runs[id(ticket.request)] = (ticket, holding)

    def get(self, ticket: Ticket) -> CoalesceHolding | None:
        found = self.runs.get(id(ticket.request))
        return found[1] if found is not None else None

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
        self.lost += renew_due(self.runs.values(), now, self.holds.renew, "coalescing")

    def drop_unadmitted(self, admitted: Any) -> None:
        """The connection is lost: runs that had not reached the pool keep their hold for
        whoever receives them next; those running keep theirs until they end."""
        for key, (ticket, holding) in list(self.runs.items()):
            if key not in admitted:
                del self.runs[key]
                self.step_aside(ticket, holding, 0.0)

    def running(self) -> Iterable[CoalesceHolding]:
        return (holding for _, holding in self.runs.values())
