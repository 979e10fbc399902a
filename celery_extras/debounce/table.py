"""Debounce, pure: per key, the burst waiting to run and the run, with leases.

No Celery import, an injectable clock. For each key the table keeps at most one *run*
(the message running, or on its way to the pool) and one *next* message: the last
message of the burst that waits for its key to be quiet, with when the burst began
(*first*) and when it is due (*due*: ``wait`` seconds after its last message arrived,
and at most ``max_wait`` seconds after its first). Each is held under a lease renewed by
its holder. :meth:`DebounceTable.ask` decides for a message that reaches a worker:

* a new message becomes the *next* one. The one it replaces is covered by it, with
  everything that one covered: its run does their work. A burst is due once it has been
  quiet for ``wait`` (or ``max_wait`` after its first message); the *next* message then
  asks again, and runs (``"run"``) unless its key still runs (``"wait"``, until that run
  ends: a message that arrives while its key runs starts the next burst);
* "last" is by send time (the producer's stamp, see :mod:`~celery_extras.admission.sent`):
  a message sent before the *next* one is covered by it (two workers may receive a
  burst's messages out of order), one sent before the run's own message by the run, and
  one sent before the last run's message, delivered after that run ended, by that run
  (*ended*: a key remembers its last run for :data:`REMEMBER` seconds);
* a message covered by a *next* or a run that has not ended is ``"covered"``: it is acked,
  and its ending context (JSON text, see :mod:`celery_extras.admission.covered`) is kept
  with its id until the run covering it ends (:meth:`DebounceTable.finish` hands them back),
  so whichever worker ends that run ends the message as if it had run;
* the *next* message asking before it is due, or while its key runs: ``"wait"``, with the
  seconds until it should ask again.

A replaced message is told it is covered when it asks again (at its own due time at the
latest, before the burst can run). One the run's end finds unconfirmed (its holder died,
or it was parked) gets its result only there, and is remembered: when it is delivered
again it is ``"covered"`` by a run that has ended (*ended*), so the worker holding it ends
it (callbacks, chain, chord part) and acks it: it never runs with stale arguments.

A run (or a *next*) whose lease ran out (its worker died) covers nothing any more: the
ids it covered, and its own, become *orphans*; the key's next run covers them, and an
orphan delivered again while a burst waits is covered by it.
:class:`~.redis_holds.RedisDebounce` keeps the same rules in Lua, cluster-wide; this table
is what a worker with no store uses, and the executable form of the rules.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..clock import wall
from ..keyed.table import RUN, KeyFinished, KeyState, KeyTable, KeyVerdict

__all__ = [
    "REMEMBER",
    "DebounceFinished",
    "DebounceHold",
    "DebounceKey",
    "DebounceTable",
    "DebounceVerdict",
    "due_of",
]

#: Seconds a key remembers its last run after it ended: a message of its burst delivered
#: later than that runs again rather than be covered (never lost).
REMEMBER = 86400.0


@dataclass
class DebounceHold:
    """A run or the *next* message: its id, its holder and when its lease ends."""

    id: str
    holder: str
    until: float
    #: when its message was sent (the producer's stamp, else its arrival)
    sent: float = 0.0
    #: a run's ``retries`` header: a higher one is the same run going on (a retry)
    retries: int = 0
    #: the *next* message: when its burst's first message arrived, and when it is due
    first: float = 0.0
    due: float = 0.0
    #: the *next* message parked in the delay store: its entry there
    entry: str = ""


class DebounceKey(KeyState[DebounceHold]):
    """One key's run, *next* message (``waiting``), covered ids (``by`` kept after a run
    ended for an id unconfirmed), orphans, confirmed ids' ending contexts (``""`` for none)
    and last run (its id and send time)."""

    def empty(self) -> bool:
        return super().empty() and not self.by


#: What a message of a debounced key does: ``"run"``, ``"wait"`` (ask again in *due*
#: seconds) or ``"covered"`` (*by*: the id of the covering run; *ended*: that run has ended,
#: so its outcome can be copied at once).
DebounceVerdict = KeyVerdict
#: A run ended (or a message was dropped): the ids it covered, the ending contexts of those
#: confirmed (by id; one without is absent), and the delay-store entry of the *next* message
#: if it is parked and due (the finisher makes it due at once).
DebounceFinished = KeyFinished


_RUN = RUN


def due_of(now: float, first: float, wait: float, max_wait: float | None) -> float:
    """When a burst that began at *first*, whose last message arrived *now*, is due."""
    due = now + wait
    return due if max_wait is None else min(due, first + max_wait)


class DebounceTable(KeyTable[DebounceKey]):
    """The bursts and runs of every key, in one process (times on *clock*, in seconds)."""

    def __init__(self, clock: Callable[[], float] = wall) -> None:
        super().__init__(DebounceKey, clock)

    @staticmethod
    def _cover(state: DebounceKey, run_id: str, covered: str) -> DebounceVerdict:
        """As the base's; a covered orphan is no orphan any more."""
        if covered in state.orphans:
            state.orphans.remove(covered)
        return KeyTable._cover(state, run_id, covered)

    def _start(self, state: DebounceKey, nxt: DebounceHold, holder: str, lease: float,
               retries: int) -> DebounceVerdict:  # fmt: skip
        state.run = DebounceHold(nxt.id, holder, self.clock() + lease, nxt.sent, retries=retries)
        state.waiting = None
        self._adopt_orphans(state, nxt.id)
        return _RUN

    def _waits(self, state: DebounceKey, nxt: DebounceHold) -> DebounceVerdict:
        """*nxt* waits: for its quiet period, or for its key's run to end."""
        now = self.clock()
        if now < nxt.due:
            return DebounceVerdict("wait", due=nxt.due - now)
        run = state.run
        return DebounceVerdict("wait", due=run.until - now if run is not None else 0.0)

    def ask(self, key: Hashable, mid: str, sent: float, holder: str, wait: float,
            max_wait: float | None, lease: float, retries: int = 0,
            context: str = "") -> DebounceVerdict:  # fmt: skip
        """Message *mid* of *key*, sent at *sent*, reached (or is held by) *holder*: what it
        does. Covered by a run (or a *next*) that has not ended, it keeps its ending
        *context*."""
        state = self._state(key)
        verdict = self._decide(state, mid, sent, holder, wait, max_wait, lease, retries)
        if verdict.kind == "covered" and verdict.by != mid and not verdict.ended:
            state.contexts[mid] = context
        self._drop_if_empty(key, state)
        return verdict

    def _decide(self, state: DebounceKey, mid: str, sent: float, holder: str, wait: float,
                max_wait: float | None, lease: float, retries: int) -> DebounceVerdict:  # fmt: skip
        run, nxt = state.run, state.waiting
        now = self.clock()
        own = self._own_run(state, mid, holder, lease, retries)
        if own is not None:
            return own
        by = state.by.get(mid)
        if by is not None:
            if (run is not None and run.id == by) or (nxt is not None and nxt.id == by):
                return DebounceVerdict("covered", by)
            del state.by[mid]  # covered by a run that has ended: it ends where it is
            return DebounceVerdict("covered", by, ended=True)
        if nxt is not None and nxt.id == mid:
            nxt.holder, nxt.until, nxt.entry = holder, now + lease, ""
            if now >= nxt.due and run is None:
                return self._start(state, nxt, holder, lease, retries)
            return self._waits(state, nxt)
        if run is not None and sent <= run.sent:  # of the burst running, delivered late
            self._cover(state, run.id, mid)
            return DebounceVerdict("covered", run.id)
        if state.last is not None and sent <= state.last.sent:  # of a burst that ran
            return DebounceVerdict("covered", state.last.id, ended=True)
        if nxt is not None and (mid in state.orphans or sent < nxt.sent):
            self._cover(state, nxt.id, mid)  # delivered again, or older than the next one
            return DebounceVerdict("covered", nxt.id)
        if mid in state.orphans:
            state.orphans.remove(mid)
        first = now if nxt is None else nxt.first
        due = due_of(now, first, wait, max_wait)
        new = DebounceHold(mid, holder, now + lease, sent, first=first, due=due)
        if nxt is not None:  # the burst goes on: the message it replaces, and all it
            moved = [*self._release(state, nxt.id), nxt.id]  # covered, are covered by this one
            for one in moved:
                self._cover(state, mid, one)
        state.waiting = new
        if now >= new.due and run is None:  # max_wait has passed: it runs now
            return self._start(state, new, holder, lease, retries)
        return self._waits(state, new)

    def finish(self, key: Hashable, mid: str, holder: str) -> DebounceFinished | None:
        """Run *mid* ended: what it covered, or ``None`` when it was no longer the key's run
        (its lease ran out: another run covers its ids). Its unconfirmed ids are remembered
        as covered by it (see the module's docstring)."""
        run = self._state(key).run
        state = self._ended(key, mid, holder)
        if state is None or run is None:
            return None
        state.last = DebounceHold(mid, holder, self.clock() + REMEMBER, run.sent)
        covered = state.covered.pop(mid, [])
        contexts: dict[str, str] = {}
        for one in covered:
            if one in state.contexts:
                state.by.pop(one, None)
                text = state.contexts.pop(one)
                if text:
                    contexts[one] = text
        nxt = state.waiting
        parked = nxt.entry if nxt is not None and nxt.due <= self.clock() else ""
        self._drop_if_empty(key, state)
        return DebounceFinished(covered, parked, contexts)

    #: the *next* message *mid* was parked in the delay store (see :meth:`KeyTable.park`)
    park_next = KeyTable.park

    def drop(self, key: Hashable, mid: str) -> DebounceFinished | None:
        """Celery discarded message *mid* (revoked, expired) before it ran: were it the
        *next* message, or the run between attempts, it is no more; the ids it covered that
        were confirmed, with their contexts (to end as it did), or ``None``. Its unconfirmed
        ids are covered no more: each asks as a new message when it asks again."""
        state = self._state(key)
        for hold in (state.waiting, state.run):
            if hold is None or hold.id != mid or (hold is state.run and hold.holder):
                continue
            confirmed, contexts = [], {}
            for one in self._release(state, mid):
                if one in state.contexts:
                    confirmed.append(one)
                    text = state.contexts.pop(one)
                    if text:
                        contexts[one] = text
            if hold is state.waiting:
                state.waiting = None
            else:
                state.run = None
            self._drop_if_empty(key, state)
            return DebounceFinished(confirmed, "", contexts)
        by = state.by.get(mid)
        live = [h.id for h in (state.run, state.waiting) if h is not None]
        if by is not None and by not in live:
            del state.by[mid]  # covered by a run that ended: never to be delivered again
        self._drop_if_empty(key, state)
        return None

    def forget(self, key: Hashable, mid: str, holder: str) -> None:
        """The *next* message *mid* was dropped by *holder* (the broker delivers it again):
        its burst waits for it, until its lease ends."""
        state = self._state(key)
        if state.waiting is not None and state.waiting.id == mid and state.waiting.holder == holder:
            state.waiting.holder = ""
        self._drop_if_empty(key, state)
