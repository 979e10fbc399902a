"""The debounce gate: the key-run machinery (:class:`~celery_extras.keyed.gate.KeyRunGate`)
with debounce's rules: a key runs once it has been quiet.

Each arriving message of a key asks the holds (:class:`~.redis_holds.RedisDebounce`, or with
no store this worker's :class:`~.table.DebounceTable`) what it does:

* **wait**: it is its key's *next* message (the last of the burst), held here (unacked, no
  pool slot, the prefetch window widened) until the burst is due (``wait`` seconds of
  quiet, ``max_wait`` after the burst's first message at the latest), or until its key's
  run ends: it asks again then (a release notice, or its own timer). Held longer than
  ``extras_delay_max_hold`` where the app's workers release parked tasks (it parks for
  another reason: a ``limit()``, a ``retry_policy()``, ``coalesce()``, the ETA store), it
  is parked in the delay store (stored, then acked) for what is left of its wait, and asks
  again wherever it comes back; elsewhere it stays held, unacked, its lease renewed by its
  asks (a copy the broker delivers twice is told it is covered by itself);
* **run**: on to the next gates, then the pool, as every key run (see the machinery);
* **covered**: a message of its key sent later replaced it (or it was sent before the
  run's own message): it is acked and counted ``debounced``, and ends with the outcome of
  the run that covers it.

While the store cannot be reached, ``extras_debounce_on_store_error`` says what a message
does: ``'hold'`` waits (unacked) and asks again every ``extras_store_retry`` seconds,
``'run'`` runs without debouncing.
"""

from __future__ import annotations

from typing import Any

from ..admission.gate import Ticket
from ..admission.handle import GateHandle
from ..admission.sent import sent_at
from ..delay.capability import parking_uses
from ..keyed.gate import KeyRules, KeyRunGate, context_text, retries_of
from ..keyed.held import Held
from ..signals import task_debounced
from .redis_holds import RedisDebounce
from .table import DebounceTable

__all__ = ["DebounceGate"]


class DebounceGate(KeyRunGate):
    """The debounce holds of one worker's consumer, as a gate of its admission pipeline."""

    label = "debounce"
    timed_waits = True  # a burst is due on time, between two ticks of the pipeline
    park_late = 0.0  # parked for what is left of its wait: it asks again when it comes back
    table, store = DebounceTable, RedisDebounce
    rules = KeyRules("debounce holds", "debounced", "debouncing", task_debounced,
                     "debounce() holds are kept per worker, so each worker debounces its own "
                     "messages")  # fmt: skip

    def question(self, ticket: Ticket, holding: Held) -> tuple[Any, ...]:
        """Its id, send time, holder, ``wait``, ``max_wait``, lease, retries and context."""
        request, spec = ticket.request, self.specs[ticket.name]
        sent = sent_at(getattr(request.message, "headers", None) or {},
                       getattr(request, "eta", None), self.wall())  # fmt: skip
        return (request.id, sent, holding.holder, spec.wait, spec.max_wait, spec.lease,
                retries_of(request), context_text(ticket, self.label))  # fmt: skip

    def start(self, handle: GateHandle, consumer: Any) -> None:
        self.parks = bool(parking_uses(self.app))  # its workers release what is parked
        super().start(handle, consumer)
