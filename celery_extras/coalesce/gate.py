"""The coalescing gate: the key-run machinery (:class:`~celery_extras.keyed.gate.KeyRunGate`)
with coalescing's rules: one run per key, cluster-wide.

Each arriving message of a key asks the holds (:class:`~.redis_holds.RedisHolds`, or with no
store this worker's :class:`~.table.CoalesceTable`) what it does: **run** (its hold renewed
until it ends; what it covered ends with its outcome), **covered** (acked, counted
``coalesced``: a run that started after it was sent, or the waiting run, does its work) or
**wait** (it is this key's waiting run, held here until the run ends: a release notice, or
its next renewal, asks again; held longer than ``extras_delay_max_hold``, it is parked in
the delay store until the run's lease ends, and the run's end makes it due at once).

While the store cannot be reached, ``extras_coalesce_on_store_error`` says what a
message does: ``'hold'`` waits (unacked) and asks again every
``extras_store_retry`` seconds, ``'run'`` runs without coalescing.
"""

from __future__ import annotations

from typing import Any

from ..admission.gate import Ticket
from ..admission.sent import sent_at
from ..keyed.gate import KeyRules, KeyRunGate, context_text, retries_of
from ..keyed.held import Held
from ..signals import task_coalesced
from .redis_holds import RedisHolds
from .table import CoalesceTable

__all__ = ["CoalesceGate"]


class CoalesceGate(KeyRunGate):
    """The coalescing holds of one worker's consumer, as a gate of its admission pipeline."""

    label = "coalesce"
    table, store = CoalesceTable, RedisHolds
    rules = KeyRules("coalescing holds", "coalesced", "coalescing", task_coalesced,
                     "coalesce() holds are kept per worker, so two workers may run one key "
                     "at once")  # fmt: skip

    def question(self, ticket: Ticket, holding: Held) -> tuple[Any, ...]:
        """Its id, send time (*now* for a message with no stamp), holder, lease, ``keep``,
        retries and ending context."""
        request, spec = ticket.request, self.specs[ticket.name]
        headers = getattr(request.message, "headers", None) or {}
        sent = sent_at(headers, getattr(request, "eta", None), self.wall())
        return (request.id, sent, holding.holder, spec.lease, spec.keep, retries_of(request),
                context_text(ticket, self.label))  # fmt: skip
