"""What the pure tables of key runs share: coalescing's, debounce's and memoize's.

No Celery import, an injectable clock. Per key, a :class:`KeyState`: at most one *run*
and one *waiting* hold (coalescing's waiting run, debounce's next message), each under a
lease its holder renews; the ids each covers; the *orphans* of a hold whose lease ran out
(its worker died), which the key's next run covers; and the last run that ended,
remembered for a while. Each policy's table decides what a message does; this keeps the
holds' leases.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from ..clock import wall

__all__ = ["RUN", "KeyFinished", "KeyState", "KeyTable", "KeyVerdict"]


@dataclass(frozen=True)
class KeyVerdict:
    """What a message of a key does: ``"run"``, ``"wait"`` or ``"covered"`` (*by*: the id
    of the covering run). A waiting message learns in *due* seconds from now when to ask
    again."""

    kind: Literal["run", "wait", "covered"]
    by: str = ""
    due: float = field(default=0.0, compare=False)
    #: covered by a run that has ended already (its result can be copied at once)
    ended: bool = field(default=False, compare=False)


#: The verdict of a message that is its key's run.
RUN = KeyVerdict("run")


@dataclass(frozen=True)
class KeyFinished:
    """A run ended (or was dropped): the ids it covered, the delay-store entry of the key's
    waiting hold if it is parked (the finisher makes it due at once), and the ending
    contexts stored with the covered ids (by id; an id without one is absent)."""

    covered: list[str]
    parked: str = ""
    contexts: dict[str, str] = field(default_factory=dict)


class Hold(Protocol):
    """A run or a waiting hold: its message id, its holder (``""`` while it goes on
    elsewhere), when its lease ends, and its delay-store entry when it is parked."""

    id: str
    holder: str
    until: float
    entry: str
    retries: int


H = TypeVar("H", bound=Hold)


@dataclass
class KeyState(Generic[H]):
    """One key's holds."""

    run: H | None = None
    #: coalescing's waiting run, debounce's *next* message
    waiting: H | None = None
    #: run (or waiting hold) id -> the ids it covers
    covered: dict[str, list[str]] = field(default_factory=dict)
    #: covered id -> the id covering it
    by: dict[str, str] = field(default_factory=dict)
    #: ids covered by a hold whose lease ran out: the next run covers them
    orphans: list[str] = field(default_factory=list)
    #: the last run that ended, and until when it is remembered (its ``until``)
    last: H | None = None
    #: covered id -> its ending context (JSON text), until the run covering it ends
    contexts: dict[str, str] = field(default_factory=dict)

    def empty(self) -> bool:
        return (self.run is None and self.waiting is None and not self.covered
                and not self.orphans)  # fmt: skip


S = TypeVar("S", bound="KeyState[Any]")


class KeyTable(Generic[S]):
    """The holds of every key, in one process (times on *clock*, in seconds; *new*: an
    empty key)."""

    def __init__(self, new: Callable[[], S], clock: Callable[[], float] = wall) -> None:
        self.clock = clock
        self.keys: dict[Hashable, S] = {}
        self._new = new

    def _state(self, key: Hashable) -> S:
        """*key*'s holds, those whose lease ran out gone (their ids orphaned)."""
        state = self.keys.get(key)
        if state is None:
            state = self.keys[key] = self._new()
        now = self.clock()
        if state.run is not None and state.run.until <= now:
            self._orphan(state, state.run.id)  # its worker died: the next run covers its ids
            state.run = None
        if state.waiting is not None and state.waiting.until <= now:
            self._orphan(state, state.waiting.id)  # its message comes back from the broker
            state.waiting = None
        if state.last is not None and state.last.until <= now:
            state.last = None
        return state

    @staticmethod
    def _release(state: S, run_id: str) -> list[str]:
        """The ids *run_id* covers, forgotten here."""
        covered: list[str] = state.covered.pop(run_id, [])
        for one in covered:
            state.by.pop(one, None)
        return covered

    def _own_run(self, state: S, mid: str, holder: str, lease: float,
                 retries: int) -> KeyVerdict | None:  # fmt: skip
        """*mid* is *state*'s run, asked again: the run still (its own ask again, a retry, or
        going on elsewhere), or a second delivery of a live run (covered by itself);
        ``None`` when *mid* is not the run."""
        run = state.run
        if run is None or run.id != mid:
            return None
        if run.holder in ("", holder) or retries > run.retries:
            run.holder, run.until = holder, self.clock() + lease
            run.retries = max(retries, run.retries)
            return RUN
        return KeyVerdict("covered", mid)

    @staticmethod
    def _keep_context(state: S, mid: str, verdict: KeyVerdict, context: str) -> KeyVerdict:
        """*verdict* on *mid*; covered by a hold that has not ended, *mid* keeps its ending
        *context* until that hold's run ends."""
        if verdict.kind == "covered" and verdict.by != mid and not verdict.ended and context:
            state.contexts[mid] = context
        return verdict

    def _ended(self, key: Hashable, mid: str, holder: str) -> S | None:
        """*key*'s holds, its run *mid* of *holder* ended (no run now); ``None`` when *mid*
        was no longer the key's run (its lease ran out: another run covers its ids)."""
        state = self._state(key)
        run = state.run
        if run is None or run.id != mid or run.holder != holder:
            self._drop_if_empty(key, state)
            return None
        state.run = None
        return state

    @staticmethod
    def _cover(state: S, run_id: str, covered: str) -> KeyVerdict:
        """*covered* is covered by *run_id* (its work done by that run)."""
        if covered != run_id and state.by.get(covered) != run_id:
            state.covered.setdefault(run_id, []).append(covered)
            state.by[covered] = run_id
        return KeyVerdict("covered", run_id)

    def _adopt_orphans(self, state: S, run_id: str) -> None:
        """The key's new run *run_id* covers the orphans of runs whose lease ran out."""
        for orphan in list(state.orphans):
            if orphan != run_id:
                self._cover(state, run_id, orphan)
        state.orphans.clear()

    def _orphan(self, state: S, run_id: str) -> None:
        """*run_id*'s hold ran out: it, and the ids it covered, are orphans."""
        for one in [*self._release(state, run_id), run_id]:
            if one not in state.orphans:
                state.orphans.append(one)

    def step_aside(
        self, key: Hashable, mid: str, holder: str, seconds: float, lease: float
    ) -> bool:
        """Run *mid* goes on elsewhere (a retry, a park, a lost connection): its hold lasts
        *seconds* + *lease* for whichever worker receives *mid* next. ``False`` if lost."""
        state = self._state(key)
        run = state.run
        if run is None or run.id != mid or run.holder != holder:
            return False
        run.holder, run.until = "", self.clock() + seconds + lease
        return True

    def park(self, key: Hashable, mid: str, holder: str, entry: str, seconds: float,
             lease: float) -> bool:  # fmt: skip
        """The waiting hold *mid* was parked in the delay store as *entry*, due in
        *seconds*: it lasts *seconds* + *lease* for whichever worker receives it. ``False``
        if it was no longer *holder*'s."""
        state = self._state(key)
        waiting = state.waiting
        if waiting is None or waiting.id != mid or waiting.holder != holder:
            return False
        waiting.holder, waiting.until, waiting.entry = "", self.clock() + seconds + lease, entry
        return True

    def renew(self, key: Hashable, ids: list[str], holder: str, lease: float) -> list[str]:
        """Extend *holder*'s holds among *ids*; the ids whose hold had run out."""
        state = self._state(key)
        lost = []
        for mid in ids:
            hold = next((h for h in (state.run, state.waiting) if h is not None and h.id == mid),
                        None)  # fmt: skip
            if hold is None or hold.holder != holder:
                lost.append(mid)
            else:
                hold.until = self.clock() + lease
        return lost

    def _drop_if_empty(self, key: Hashable, state: S) -> None:
        if state.empty() and state.last is None:
            self.keys.pop(key, None)

    @staticmethod
    def _take_contexts(state: S, ids: list[str]) -> dict[str, str]:
        return {one: state.contexts.pop(one) for one in ids if one in state.contexts}

    def drop(self, key: Hashable, mid: str) -> KeyFinished | None:
        """Celery discarded message *mid* (revoked, expired) before it ran: if it was the
        key's waiting hold, or its run between attempts, it is no more; the ids it covered
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
                return KeyFinished(covered, "", contexts)
        return None

    def forget(self, key: Hashable, mid: str, holder: str) -> None:
        """The waiting hold *mid* was dropped by *holder* (the broker delivers it again)."""
        state = self._state(key)
        if state.waiting is not None and state.waiting.id == mid and state.waiting.holder == holder:
            self._orphan(state, mid)
            state.waiting = None
        self._drop_if_empty(key, state)
