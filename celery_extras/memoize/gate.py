"""The memoize gate: the key-run machinery (:class:`~celery_extras.keyed.gate.KeyRunGate`)
with memoize's rules.

A message of a key with a result younger than ``ttl`` is covered by the run that made it, a
run that has ended: it ends here with that run's stored result (its callbacks, chain and
chord part: the canvas rule), then is acked, and counts ``memoized``. One of a key whose run
is in flight joins it (covered, acked, ended by whichever worker ends the run). Otherwise it
is the key's run; as it ends, its result is kept for ``ttl`` when it succeeded and the task
stores results (a failure is not kept), and the task keeps at most ``max_keys`` keys.

Hits read the run's result from the result backend: without one (or with
``ignore_result``) nothing is kept, runs in flight are still joined, and the worker says so
at start.
"""

from __future__ import annotations

from typing import Any

from ..admission.gate import Ticket
from ..admission.handle import GateHandle
from ..keyed.gate import KeyRules, KeyRunGate, context_text, retries_of
from ..keyed.held import Held
from ..signals import task_memoized
from .redis_memo import RedisMemo
from .table import MemoizeTable

__all__ = ["MemoizeGate"]


class MemoizeGate(KeyRunGate):
    """The memoize holds of one worker's consumer, as a gate of its admission pipeline."""

    label = "memoize"
    table, store = MemoizeTable, RedisMemo
    rules = KeyRules("memoize holds", "memoized", "memoizing", task_memoized,
                     "memoize() results are kept per worker")  # fmt: skip

    def question(self, ticket: Ticket, holding: Held) -> tuple[Any, ...]:
        request = ticket.request
        return (request.id, holding.holder, holding.lease, retries_of(request),
                context_text(ticket, self.label))  # fmt: skip

    def ending(self, ticket: Ticket) -> tuple[Any, ...]:
        """Kept for ``ttl`` when the run returned and its result is stored; else not kept."""
        spec = self.specs[ticket.name]
        stored = ticket.outcome is True and self.endings.stores_results(ticket.name)
        return (spec.ttl if stored else 0.0, spec.max_keys)

    def start(self, handle: GateHandle, consumer: Any) -> None:
        super().start(handle, consumer)
        blind = sorted(name for name in self.specs if not self.endings.stores_results(name))
        if blind:
            self.logger.error(
                "celery-extras: memoize() needs a result backend: %s store no result "
                "(no result backend, or ignore_result), so no result is kept for them; "
                "messages of a key in flight are still joined", ", ".join(blind),
            )  # fmt: skip
