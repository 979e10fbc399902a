"""Coalescing, pure: client-go's *dirty* and *processing* sets, per key, with leases.

No Celery import, an injectable clock. For each key the table keeps at most one
*run* (the message running, or on its way to the pool) and one *waiting* run (a
message held until the run ends), each under a lease renewed by its holder, and
which message ids each covers. :meth:`CoalesceTable.ask` decides for a message
that reaches a worker:

* ``"run"``: nothing runs the key: this message is the run (it covers every message of
  the key sent before now, its *cutoff*);
* ``"covered"``: a run that started after the message was sent, or the waiting run,
  will do its work: ack it, its result is the covering run's;
* ``"wait"``: the key runs, and started before this message was sent: this message is
  the waiting run, asked again (:meth:`ask` with the same id) when the run ends.

A covered message's *ending context* (JSON text, see
:mod:`celery_extras.admission.covered`) is kept with its id until the run covering it
ends (:meth:`CoalesceTable.finish` hands them back with the ids), so whichever worker
ends that run ends the message as if it had run; an id covered without one gets its
result only.

A key remembers its last run's start for :data:`REMEMBER` seconds after it ended, so a
message sent before that run started but delivered after it ended (a backlog, a
prefetched batch) is covered by it too. A run whose lease ran out (its worker died)
covers nothing any more: the ids it
covered, and its own, become *orphans*, inherited by the key's next run, so each
caller's result still comes from a run that started after its message was sent.
:class:`~.redis_holds.RedisHolds` keeps the same rules in Lua, cluster-wide; this
table is what a worker with no store uses, and the executable form of the rules.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..clock import wall
from ..keyed.table import RUN, KeyFinished, KeyState, KeyTable, KeyVerdict

__all__ = [
    "KEEP",
    "REMEMBER",
    "CoalesceFinished",
    "CoalesceHold",
    "CoalesceKey",
    "CoalesceTable",
    "CoalesceVerdict",
]

#: ``coalesce(keep=...)``: whose arguments the waiting run takes.
KEEP = ("first", "last")
#: Seconds a key remembers its last run (and its orphans) after the last change: a message
#: delivered later than that runs again rather than be covered (never lost).
REMEMBER = 86400.0


@dataclass
class CoalesceHold:
    """A run or a waiting run: its message id, its holder and when its lease ends."""

    id: str
    holder: str
    until: float
    #: a run's cutoff: it covers the messages sent before this time
    cutoff: float = 0.0
    #: a run's ``retries`` header: a higher one is the same run going on (a retry)
    retries: int = 0
    #: a waiting run parked in the delay store: its entry there (made due when the run ends)
    entry: str = ""


class CoalesceKey(KeyState[CoalesceHold]):
    """One key's run, waiting run (``waiting``), covered ids, orphans and last run (its id
    and cutoff)."""


#: What a message of a coalesced key does: ``"run"``, ``"wait"`` or ``"covered"`` (*by*: the
#: id of the covering run); a waiting run learns when the run's lease ends (*due*, seconds
#: from now): should its worker die, the key frees then.
CoalesceVerdict = KeyVerdict
#: A run ended (or was dropped): the ids it covered, the delay-store entry of the waiting run
#: if it is parked (the finisher makes it due at once), and the covered ids' ending contexts.
CoalesceFinished = KeyFinished


_RUN = RUN


class CoalesceTable(KeyTable[CoalesceKey]):
    """The holds of every key, in one process (times on *clock*, in seconds)."""

    def __init__(self, clock: Callable[[], float] = wall) -> None:
        super().__init__(CoalesceKey, clock)

    def _orphan(self, state: CoalesceKey, run_id: str) -> None:
        """As the base's; the hold's own id is covered by nothing any more either."""
        state.by.pop(run_id, None)
        super()._orphan(state, run_id)

    def _start(
        self, state: CoalesceKey, mid: str, holder: str, lease: float, retries: int
    ) -> CoalesceVerdict:
        now = self.clock()
        state.run = CoalesceHold(mid, holder, now + lease, cutoff=now, retries=retries)
        self._adopt_orphans(state, mid)
        return _RUN

    def ask(
        self, key: Hashable, mid: str, sent: float, holder: str, lease: float,
        keep: str = "first", retries: int = 0, context: str = "",
    ) -> CoalesceVerdict:  # fmt: skip
        """Message *mid* of *key*, sent at *sent*, reached *holder*: what it does. Covered by
        a run (or the waiting run) that has not ended, it keeps its ending *context*."""
        state = self._state(key)
        verdict = self._own_run(state, mid, holder, lease, retries) or self._decide(
            state, mid, sent, holder, lease, keep, retries
        )
        return self._keep_context(state, mid, verdict, context)

    def _decide(self, state: CoalesceKey, mid: str, sent: float, holder: str, lease: float,
                keep: str, retries: int) -> CoalesceVerdict:  # fmt: skip
        run, wait = state.run, state.waiting
        now = self.clock()
        if mid in state.by:
            return CoalesceVerdict("covered", state.by[mid])
        if wait is not None and wait.id == mid:
            if run is None:  # the run ended: the waiting run starts, with what it covers
                state.waiting = None
                return self._start(state, mid, holder, lease, retries)
            wait.holder, wait.until, wait.entry = holder, now + lease, ""
            return CoalesceVerdict("wait", due=run.until - now)
        if run is not None and sent <= run.cutoff:
            return self._cover(state, run.id, mid)
        if state.last is not None and sent <= state.last.cutoff:
            return CoalesceVerdict("covered", state.last.id, ended=True)  # sent before it started
        if wait is not None:
            if keep == "first" or run is None:
                return self._cover(state, wait.id, mid)
            # keep="last": this message is the waiting run now, and covers the one it replaces
            moved = [*self._release(state, wait.id), wait.id]
            state.by.pop(wait.id, None)
            state.waiting = CoalesceHold(mid, holder, now + lease)
            for covered in moved:
                self._cover(state, mid, covered)
            return CoalesceVerdict("wait", due=run.until - now)
        if run is None:
            return self._start(state, mid, holder, lease, retries)
        state.waiting = CoalesceHold(mid, holder, now + lease)
        return CoalesceVerdict("wait", due=run.until - now)

    def finish(self, key: Hashable, mid: str, holder: str) -> CoalesceFinished | None:
        """Run *mid* ended: what it covered, or ``None`` when it was no longer the key's run
        (its lease ran out: another run covers its ids)."""
        run = self._state(key).run
        state = self._ended(key, mid, holder)
        if state is None or run is None:
            return None
        state.last = CoalesceHold(mid, holder, self.clock() + REMEMBER, cutoff=run.cutoff)
        covered = self._release(state, mid)
        parked = state.waiting.entry if state.waiting is not None else ""
        contexts = self._take_contexts(state, covered)
        self._drop_if_empty(key, state)
        return CoalesceFinished(covered, parked, contexts)

    #: the waiting run *mid* was parked in the delay store (see :meth:`KeyTable.park`)
    park_wait = KeyTable.park
