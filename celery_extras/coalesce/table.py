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
from dataclasses import dataclass, field
from typing import Literal

from ..clock import wall
from .key_table import KeyState, KeyTable

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


@dataclass(frozen=True)
class CoalesceVerdict:
    """What a message of a coalesced key does: ``"run"``, ``"wait"`` or ``"covered"``
    (*by*: the id of the covering run). A waiting run learns when the run's lease ends
    (*due*, seconds from now): should its worker die, the key frees then."""

    kind: Literal["run", "wait", "covered"]
    by: str = ""
    due: float = field(default=0.0, compare=False)
    #: covered by a run that has ended already (its result can be copied at once)
    ended: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class CoalesceFinished:
    """A run ended (or was dropped): the ids it covered, the delay-store entry of the waiting
    run if it is parked (the finisher makes it due at once), and the ending contexts stored
    with the covered ids (by id; an id without one is absent)."""

    covered: list[str]
    parked: str = ""
    contexts: dict[str, str] = field(default_factory=dict)


_RUN = CoalesceVerdict("run")


class CoalesceTable(KeyTable[CoalesceKey]):
    """The holds of every key, in one process (times on *clock*, in seconds)."""

    def __init__(self, clock: Callable[[], float] = wall) -> None:
        super().__init__(CoalesceKey, clock)

    def _orphan(self, state: CoalesceKey, run_id: str) -> None:
        """As the base's; the hold's own id is covered by nothing any more either."""
        state.by.pop(run_id, None)
        super()._orphan(state, run_id)

    @staticmethod
    def _cover(state: CoalesceKey, run_id: str, covered: str) -> CoalesceVerdict:
        if covered != run_id and state.by.get(covered) != run_id:
            state.covered.setdefault(run_id, []).append(covered)
            state.by[covered] = run_id
        return CoalesceVerdict("covered", run_id)

    def _start(
        self, state: CoalesceKey, mid: str, holder: str, lease: float, retries: int
    ) -> CoalesceVerdict:
        now = self.clock()
        state.run = CoalesceHold(mid, holder, now + lease, cutoff=now, retries=retries)
        for orphan in state.orphans:
            if orphan != mid:
                self._cover(state, mid, orphan)
        state.orphans.clear()
        return _RUN

    def ask(
        self, key: Hashable, mid: str, sent: float, holder: str, lease: float,
        keep: str = "first", retries: int = 0, context: str = "",
    ) -> CoalesceVerdict:  # fmt: skip
        """Message *mid* of *key*, sent at *sent*, reached *holder*: what it does. Covered by
        a run (or the waiting run) that has not ended, it keeps its ending *context*."""
        state = self._state(key)
        verdict = self._decide(state, mid, sent, holder, lease, keep, retries)
        if verdict.kind == "covered" and verdict.by != mid and not verdict.ended and context:
            state.contexts[mid] = context
        return verdict

    def _decide(self, state: CoalesceKey, mid: str, sent: float, holder: str, lease: float,
                keep: str, retries: int) -> CoalesceVerdict:  # fmt: skip
        run, wait = state.run, state.waiting
        now = self.clock()
        if run is not None and run.id == mid:
            if run.holder in ("", holder) or retries > run.retries:
                run.holder, run.until, run.retries = holder, now + lease, max(retries, run.retries)
                return _RUN  # the run itself, asked again, or going on (a retry, a park)
            return CoalesceVerdict("covered", mid)  # a second delivery of a live run
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
        state = self._state(key)
        run = state.run
        if run is None or run.id != mid or run.holder != holder:
            self._drop_if_empty(key, state)
            return None
        state.run = None
        state.last = CoalesceHold(mid, holder, self.clock() + REMEMBER, cutoff=run.cutoff)
        covered = self._release(state, mid)
        parked = state.waiting.entry if state.waiting is not None else ""
        contexts = self._take_contexts(state, covered)
        self._drop_if_empty(key, state)
        return CoalesceFinished(covered, parked, contexts)

    @staticmethod
    def _take_contexts(state: CoalesceKey, ids: list[str]) -> dict[str, str]:
        return {one: state.contexts.pop(one) for one in ids if one in state.contexts}

    def park_wait(self, key: Hashable, mid: str, holder: str, entry: str, seconds: float,
                  lease: float) -> bool:  # fmt: skip
        """The waiting run *mid* was parked in the delay store as *entry*, due in *seconds*:
        its hold lasts *seconds* + *lease* for whichever worker receives it. ``False`` if
        it was no longer *holder*'s."""
        return self._park(key, mid, holder, entry, seconds, lease)

    def drop(self, key: Hashable, mid: str) -> CoalesceFinished | None:
        """Celery discarded message *mid* (revoked, expired) before it ran: if it was the
        key's waiting run, or its run between attempts, it is no more; the ids it covered
        and their contexts (to end as it did), or ``None`` when it held nothing."""
        state = self._state(key)
        for hold in (state.waiting, state.run):
            if hold is not None and hold.id == mid and (hold is state.waiting or not hold.holder):
                covered = self._release(state, mid)
                if hold is state.waiting:
                    state.waiting = None
                else:
                    state.run = None
                contexts = self._take_contexts(state, covered)
                self._drop_if_empty(key, state)
                return CoalesceFinished(covered, "", contexts)
        return None

    def forget(self, key: Hashable, mid: str, holder: str) -> None:
        """The waiting run *mid* was dropped by *holder* (the broker delivers it again)."""
        state = self._state(key)
        if state.waiting is not None and state.waiting.id == mid and state.waiting.holder == holder:
            self._orphan(state, mid)
            state.waiting = None
        self._drop_if_empty(key, state)
