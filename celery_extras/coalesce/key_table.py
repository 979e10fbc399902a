"""What the pure tables of key holds share: coalescing's and debounce's (which runs on the
coalescing holds).

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
from typing import Any, Generic, Protocol, TypeVar

from ..clock import wall

__all__ = ["KeyState", "KeyTable"]


class Hold(Protocol):
    """A run or a waiting hold: its message id, its holder (``""`` while it goes on
    elsewhere), when its lease ends, and its delay-store entry when it is parked."""

    id: str
    holder: str
    until: float
    entry: str


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

    def _park(self, key: Hashable, mid: str, holder: str, entry: str, seconds: float,
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
