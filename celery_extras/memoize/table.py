"""Memoize, pure: per key, the run in flight and the last result kept, with an LRU bound.

No Celery import, an injectable clock; the rules of ``memoize()`` on the key-run tables
(:class:`~celery_extras.keyed.table.KeyTable`: leases, covered ids, orphans).
:meth:`MemoizeTable.ask` decides for a message that reaches a worker:

* ``"covered"`` by the key's run in flight: it joins it (one run, every caller its result;
  its ending context is kept until that run ends);
* ``"covered"``, *ended*, by the key's last run whose result is younger than its ``ttl``: it
  does not run, it ends with that result (the gate reads it from the result backend); the
  key is used now (least recently used goes first);
* ``"run"``: neither: this message is the key's run (it covers the orphans of a run whose
  worker died).

:meth:`MemoizeTable.finish` keeps the run's result for ``ttl`` seconds when it succeeded
(*kept* > 0; a failure is not kept: the next message runs), and then keeps at most
``max_keys`` keys of the task, forgetting the least recently used. :meth:`invalidate`
forgets a key's result. :class:`~.redis_memo.RedisMemo` keeps the same rules in Lua,
cluster-wide; this table is what a worker with no store uses, and the executable form of
the rules.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..clock import wall
from ..keyed.table import RUN, KeyFinished, KeyState, KeyTable, KeyVerdict

__all__ = ["MemoHold", "MemoKey", "MemoizeTable"]


@dataclass
class MemoHold:
    """The run (or the last run kept): its message id, its holder and when its lease (or
    the kept result) ends."""

    id: str
    holder: str
    until: float
    #: a run's ``retries`` header: a higher one is the same run going on (a retry)
    retries: int = 0
    entry: str = ""
    #: a run invalidated while it ran: its result is not kept
    stale: bool = False


class MemoKey(KeyState[MemoHold]):
    """One key's run, covered ids, orphans and last run kept (``last``)."""


class MemoizeTable(KeyTable[MemoKey]):
    """The runs and kept results of every key (a ``(task, key)`` pair), in one process."""

    def __init__(self, clock: Callable[[], float] = wall) -> None:
        super().__init__(MemoKey, clock)
        #: per task, its keys with a result kept, least recently used first
        self.lru: dict[str, OrderedDict[Hashable, None]] = {}

    def ask(self, key: tuple[str, str], mid: str, holder: str, lease: float, retries: int = 0,
            context: str = "") -> KeyVerdict:  # fmt: skip
        """Message *mid* of *key* reached *holder*: what it does. Joining a run in flight, it
        keeps its ending *context* until that run ends."""
        state = self._state(key)
        verdict = self._own_run(state, mid, holder, lease, retries)
        if verdict is None:
            verdict = self._decide(key, state, mid, holder, lease, retries)
        return self._keep_context(state, mid, verdict, context)

    def _decide(self, key: tuple[str, str], state: MemoKey, mid: str, holder: str, lease: float,
                retries: int) -> KeyVerdict:  # fmt: skip
        if mid in state.by:
            return KeyVerdict("covered", state.by[mid])
        if state.run is not None:  # joins the run in flight
            return self._cover(state, state.run.id, mid)
        if state.last is not None:  # a result younger than its ttl
            self._touch(key)
            return KeyVerdict("covered", state.last.id, ended=True)
        state.run = MemoHold(mid, holder, self.clock() + lease, retries=retries)
        self._adopt_orphans(state, mid)
        return RUN

    def finish(self, key: tuple[str, str], mid: str, holder: str, kept: float = 0.0,
               max_keys: int = 1) -> KeyFinished | None:  # fmt: skip
        """Run *mid* ended: what it covered, or ``None`` when it was no longer the key's run.
        Its result is kept *kept* seconds (0: not kept, a failure), then the task keeps at
        most *max_keys* keys."""
        run = self._state(key).run
        state = self._ended(key, mid, holder)
        if state is None or run is None:
            return None
        covered = self._release(state, mid)
        contexts = self._take_contexts(state, covered)
        if kept > 0 and not run.stale:
            state.last = MemoHold(mid, holder, self.clock() + kept)
            self._touch(key)
            self._evict(key[0], max_keys)
        self._drop_if_empty(key, state)
        return KeyFinished(covered, "", contexts)

    def invalidate(self, key: tuple[str, str]) -> bool:
        """Forget *key*'s kept result, and that of its run in flight (not kept as it ends):
        its next message runs. Whether it had either."""
        self.lru.get(key[0], OrderedDict()).pop(key, None)
        state = self._state(key)
        had = state.last is not None or state.run is not None
        if state.run is not None:
            state.run.stale = True
        state.last = None
        self._drop_if_empty(key, state)
        return had

    def kept(self, name: str) -> int:
        """How many keys of task *name* have a result kept (expired ones included until
        they are evicted)."""
        return len(self.lru.get(name, ()))

    def _touch(self, key: tuple[str, str]) -> None:
        lru = self.lru.setdefault(key[0], OrderedDict())
        lru[key] = None
        lru.move_to_end(key)

    def _evict(self, name: str, max_keys: int) -> None:
        lru = self.lru[name]
        while len(lru) > max_keys:
            old, _ = lru.popitem(last=False)
            state = self.keys.get(old)
            if state is not None:
                state.last = None
                self._drop_if_empty(old, state)
