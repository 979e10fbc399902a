"""How a key-run gate ends what its runs covered (a mixin of
:class:`~celery_extras.keyed.gate.KeyRunGate`): a run's finish answered, the endings its
run owes published and then said ended (:mod:`.owed`), a message covered by a run that
had ended ended where it arrives (marked ended in the store before its ack), and what a
discarded run covered ended as it was.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..admission.covered import CoveredEndings, pause_for_tests
from ..admission.gate import COVERED, QUEUED, Answer, Ticket
from ..admission.notices import Bucket
from ..admission.serial import serial
from .held import Held, Waiting
from .holds import KeyRunHolds
from .owed import OwedEndings, Unfinished
from .purged import ParkedRuns
from .runs import covered_messages, revoked_outcome
from .table import KeyFinished

__all__ = ["PAUSE_ENV", "KeyEndings"]

#: Test-only (documented in docs/reliability.rst): seconds a key-run gate waits between a
#: run's ``finish`` and publishing what it covered, a window for a test's SIGKILL.
PAUSE_ENV = "CELERY_EXTRAS_TEST_PAUSE_ENDINGS"


class KeyEndings:
    """The endings part of a key-run gate (its attributes are the gate's)."""

    holds: KeyRunHolds
    endings: CoveredEndings
    owed: OwedEndings
    parked_runs: ParkedRuns
    waiting: Waiting
    rules: ClassVar[Any]
    _consumer: Any
    _handle: Any

    def wake(self, bucket: Bucket, due_only: bool = False) -> None:
        raise NotImplementedError

    def _end_here(self, ticket: Ticket, holding: Held, by: str) -> Answer:
        """*ticket*'s message, covered by run *by* that ended, ends here (marked ended in
        the store before its ack), then is acked; delivered again after it was ended (its
        ack lost with the connection), it is acked at once, not ended twice."""
        mid = ticket.request.id
        if self.holds.was_ended(holding.bucket, mid):
            return COVERED
        self.endings.end_here(self._consumer, self._handle, ticket, by,
                              mark=lambda: self.holds.mark_ended(holding.bucket, mid))  # fmt: skip
        return QUEUED

    def _finished(self, run: Unfinished, done: KeyFinished) -> None:
        """*run*'s finish answered: what it covered ends, its key's next run goes on."""
        self._end_owed(run.bucket, run.run_id, run.holder, done, run.known)
        if done.parked:
            self._handle.hurry(done.parked, self.rules.parked)
        if run.bucket in self.waiting:
            self.wake(run.bucket)

    def _end_owed(self, bucket: Bucket, by: str, holder: str, done: KeyFinished,
                  known: Any) -> None:  # fmt: skip
        """End the messages run *by* covered with its outcome (stored, else *known*); the
        store keeps them owed (claimed by *holder*) until they are ended."""
        if not done.covered:
            return
        ended = self.owed.publishing_for(bucket, by, holder)
        job = (self._consumer, bucket[0], by, covered_messages(done), known, ended)
        pause = pause_for_tests(PAUSE_ENV)
        if pause and self._consumer is not None:  # a test's window: see PAUSE_ENV
            serial(self._consumer).call_after(pause, self.endings.schedule, job)
            return
        self.endings.schedule(*job)

    def _end_covered(self, name: str, by: str, done: KeyFinished, known: Any) -> None:
        """End the messages run *by* covered with its outcome (stored, else *known*)."""
        if done.covered:
            self.endings.schedule(self._consumer, name, by, covered_messages(done), known=known)

    def _parked(self, bucket: Bucket, mid: str, holding: Held, entry: str,
                seconds: float) -> None:  # fmt: skip
        """Waiting hold *mid* was parked as *entry* for *seconds*: its hold kept for whoever
        receives it, and its entry watched (a purge drops it: :mod:`.purged`)."""
        if self.holds.park(bucket, mid, holding.holder, entry, seconds, holding.lease):
            self.parked_runs.add(entry, bucket, mid, seconds + holding.lease)

    def _end_purged(self) -> None:
        """A parked waiting run a purge dropped: its hold goes (not adopted, not ended by the
        key's next run) and what it covered ends revoked, as Celery ends a revoked task."""
        if self._handle is None or not len(self.parked_runs):
            return
        for run in self.parked_runs.purged(self._handle.purged):
            dropped = self.holds.drop(run.bucket, run.run_id)
            if dropped is not None and dropped.covered:
                self.endings.end_purged(self._consumer, run.bucket[0], covered_messages(dropped),
                                        revoked_outcome(run.run_id))  # fmt: skip
