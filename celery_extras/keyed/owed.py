"""The endings a key's run owes the messages it covered, kept until they are published.

A run's ``finish`` (one script) takes what it covered out of its key and keeps it as owed,
claimed by the finisher, until the finisher says the endings are published (``ended``).
So nothing is lost where the finisher is cut off:

* **its finish's reply is lost** (a store timeout: the script may have run, as when a
  stalled connection forwards it later): the finish is asked again at each tick until the
  store answers; a finish asked again after the run ended answers with what it still owes;
* **it dies before the endings are published** (SIGKILL): its claim runs out after
  :data:`~celery_extras.keyed.redis.OWED` seconds (renewed meanwhile while it waits for the
  run's outcome), and a sweep of any worker, every :data:`SWEEP` seconds, claims and ends
  them with the run's stored outcome.

An ending is published at least once: a finisher that dies after publishing but before
``ended`` has the sweep publish it again. With no store (one worker's table) there is
nothing to keep: the worker's death loses its holds anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..admission.covered import Outcome
from ..admission.notices import Bucket
from .holds import KeyRunHolds
from .redis import OWED
from .table import KeyFinished

__all__ = ["SWEEP", "OwedEndings", "Unfinished"]

logger = logging.getLogger("celery_extras.keyed")

#: Seconds between two sweeps of a worker for owed endings whose finisher died.
SWEEP = 5.0
#: Most keys one sweep looks at.
SWEEP_KEYS = 20


@dataclass(frozen=True)
class Unfinished:
    """A run that ended, whose finish the store has not answered: asked again."""

    bucket: Bucket
    run_id: str
    holder: str
    ending: tuple[Any, ...]
    known: Outcome | None


#: ``end(bucket, run_id, holder, done, known)``: end what a run covered, then call ``ended``.
End = Callable[[Bucket, str, str, KeyFinished, "Outcome | None"], None]
#: ``finished(run, done)``: a finish asked again answered.
Finished = Callable[[Unfinished, KeyFinished], None]


class OwedEndings:
    """One gate's finishes asked again, the endings it is publishing (their claims renewed,
    their ``ended`` asked again until the store answers) and its sweep."""

    def __init__(self, holds: KeyRunHolds, sweeper: str, clock: Callable[[], float]) -> None:
        self.holds, self.sweeper, self.clock = holds, sweeper, clock
        self.unfinished: list[Unfinished] = []
        #: (bucket, run id, holder) -> when its claim was last renewed
        self.publishing: dict[tuple[Bucket, str, str], float] = {}
        self.unacknowledged: list[tuple[Bucket, str, str]] = []
        self.next_sweep = clock() + SWEEP
        self.counts = {"finish_again": 0, "swept": 0}

    def retry(self, run: Unfinished) -> None:
        """*run*'s finish went unanswered: asked again at the next ticks."""
        self.unfinished.append(run)

    def publishing_for(self, bucket: Bucket, run_id: str, holder: str) -> Callable[[], None]:
        """Note that the endings *run_id* owes are being published; the call that says they
        were (``ended``)."""
        one = (bucket, run_id, holder)
        self.publishing[one] = self.clock()
        self.holds.note_owed(bucket)

        def ended() -> None:
            self.publishing.pop(one, None)
            if not self.holds.ended(bucket, run_id, holder):
                self.unacknowledged.append(one)

        return ended

    def tick(self, finished: Finished, end: End) -> None:
        """Finishes asked again, claims renewed, ``ended`` asked again, and the sweep due."""
        self.finish_again(finished)
        for one in list(self.unacknowledged):
            if not self.holds.ended(*one):
                break
            self.unacknowledged.remove(one)
        self._renew()
        if self.clock() >= self.next_sweep:
            self.next_sweep = self.clock() + SWEEP
            self.sweep(end)

    def finish_again(self, finished: Finished, now: bool = False) -> None:
        """Ask the unanswered finishes again, in order, until the store does not answer;
        *now*: even while this worker backs off from the store (it is stopping: chaos seed
        878676, a warm stop 0.4 s after a stalled store came back, before the back-off let
        the finish be asked again, left a run's endings owed and noted nowhere a sweep looks,
        for good). An answered finish notes its key as owing (:meth:`publishing_for`), so a
        sweep ends what it owes should this worker not."""
        for run in list(self.unfinished):
            done = self.holds.finish(run.bucket, run.run_id, run.holder, *run.ending, now=now)
            if done is None:
                return  # the store is still away
            self.unfinished.remove(run)
            self.counts["finish_again"] += 1
            finished(run, done)

    def _renew(self) -> None:
        now = self.clock()
        for (bucket, run_id, holder), renewed in list(self.publishing.items()):
            if now - renewed >= OWED / 3:
                self.publishing[(bucket, run_id, holder)] = now
                self.holds.renew(bucket, [run_id], holder, OWED)

    def sweep(self, end: End) -> None:
        """Claim and end the owed endings whose finisher's claim ran out."""
        for bucket in self.holds.owed_due(SWEEP_KEYS):
            claimed = self.holds.claim_owed(bucket, self.sweeper)
            if claimed is None:
                return
            for run_id, done in claimed:
                self.counts["swept"] += len(done.covered)
                logger.warning(
                    "celery-extras: ending the %d message(s) run %s of %s covered, whose "
                    "endings its worker did not publish", len(done.covered), run_id, bucket[0],
                )  # fmt: skip
                end(bucket, run_id, self.sweeper, done, None)
