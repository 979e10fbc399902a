"""The waiting runs a key-run gate parked, watched until the delay store says what became of
them: one that ``celery purge`` (or ``celery extras delayed --drop``) dropped never comes
back, so the gate drops its hold and ends what it covered as Celery ends a revoked task.

A purged parked waiting run *W* of a key (coalescing's waiting run, debounce's next message)
covered messages that were acked and have callers waiting on them. A purge means "do not run
what is queued": they end ``REVOKED`` (chord parts failed, no callbacks), nothing is published
again, and *W* itself stays as Celery leaves a purged message, with no state; its hold is
dropped (the ``dropped`` operation), so the key's next run neither adopts nor ends it.

The worker that parked *W* watches its entry (:meth:`~.delay.store.DelayStore.purged`, one
``HMGET`` per shard every :data:`CHECK` seconds for all it watches) until the entry is taken
or its hold would have run out. Should that worker die first, nobody watches: *W*'s hold runs
out and the key's next run adopts what it covered, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..admission.notices import Bucket

__all__ = ["CHECK", "ParkedRun", "ParkedRuns"]

#: Seconds between two checks of the parked waiting runs' entries.
CHECK = 1.0


@dataclass(frozen=True)
class ParkedRun:
    """Waiting run *run_id* of *bucket*, parked as a delay-store entry, its hold kept until
    *until* (the gate's clock)."""

    bucket: Bucket
    run_id: str
    until: float


class ParkedRuns:
    """The waiting runs one gate parked, by entry id, and the checks of what became of them."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.runs: dict[str, ParkedRun] = {}
        self.next_check = 0.0

    def __len__(self) -> int:
        return len(self.runs)

    def add(self, entry: str, bucket: Bucket, run_id: str, held: float) -> None:
        """*run_id* of *bucket* was parked as *entry*, its hold kept *held* seconds."""
        self.runs[entry] = ParkedRun(bucket, run_id, self.clock() + held)

    def purged(self, fates_of: Callable[[list[str]], dict[str, bool | None] | None]
               ) -> list[ParkedRun]:  # fmt: skip
        """At most every :data:`CHECK` seconds: the runs whose entry the delay store says a
        purge dropped (forgotten, with those taken, unknown or whose hold ran out), as
        *fates_of* tells (``None``: the store failed; the runs are checked again next time)."""
        now = self.clock()
        if not self.runs or now < self.next_check:
            return []
        self.next_check = now + CHECK
        for entry in [entry for entry, run in self.runs.items() if run.until <= now]:
            del self.runs[entry]
        fates = fates_of(list(self.runs)) if self.runs else {}
        if fates is None:
            return []
        gone = [entry for entry, fate in fates.items() if fate is not False]
        return [run for entry in gone
                if (run := self.runs.pop(entry, None)) is not None and fates[entry]]  # fmt: skip
