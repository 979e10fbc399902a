"""Merging revokes into the worker's own state: Celery's ``revoked`` set and ``revoked_stamps``.

An id that arrives with an expiry (from the store) is stamped so that Celery's
:class:`~celery.utils.collections.LimitedSet` expires it at that very time; an id
without one (from a neighbour) gets the set's own expiry, as Celery's Mingle does.
Stamps have no expiry in Celery; the ones merged here are removed when theirs
passes. What the worker learns other than from the store (a ``revoke`` broadcast
without a client's "stored" mark, a neighbour's reply) waits in
:attr:`WorkerRevokes.unstored_ids` until :meth:`WorkerRevokes.unstored` hands it
back to be written to the store. Nothing is kept per id beside Celery's own set:
an id's expiry is read back from the set's own insertion time. Runs in the
consumer's thread only.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..bounds import MAX_WAIT
from .entries import MAX_ID_LENGTH, Stamp, expiry_of, valid_id, valid_stamp

__all__ = ["KNOWN_GRACE", "WorkerRevokes", "trim_oldest"]

#: Seconds a stamp stays "known to be stored" after its expiry, so clock skew
#: between Redis and this host never makes an expired revoke look new again.
KNOWN_GRACE = 60.0


class WorkerRevokes:
    """The worker's revoked ids and stamps, and which of them the store does not hold yet."""

    def __init__(
        self,
        revoked: Any,
        revoked_stamps: dict[str, Any],
        default_expires: float,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        max_entries: int | None = None,
        newest: Callable[[Any, int], list[Any]] | None = None,
    ) -> None:
        self.revoked = revoked  # celery.utils.collections.LimitedSet
        #: the *n* ids added last to *revoked*, oldest first (the worker step hands the
        #: fast reader of Celery's ``LimitedSet``; by default its own sorted iteration)
        self.newest = newest or _newest
        self.revoked_stamps = revoked_stamps
        self.default_expires = default_expires
        #: Most entries of each structure below (and of stamps merged into Celery's
        #: ``revoked_stamps``): the revoked set's own ``maxlen``, as Celery bounds it.
        self.max_entries: int = max_entries or getattr(revoked, "maxlen", None) or 50_000
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        #: Ids learnt other than from the store, with their expiry, until handed back.
        self.unstored_ids: dict[str, float] = {}
        self.known_stamps: dict[Stamp, float] = {}
        self.stamp_expiry: dict[Stamp, float] = {}
        #: Ids that came in (merged or revoked here) since the owner last reset it.
        self.churn = 0

    @property
    def life(self) -> float:
        """Seconds an id lives in Celery's set after its insertion time."""
        return float(self.revoked.expires or self.default_expires)

    def merge_ids(self, ids: Mapping[str, float | None], stored: bool) -> int:
        """Add *ids* (-> expiry, or ``None`` for the set's own); return how many were new.

        *stored* ids come from the store, which therefore need not be told of them;
        the others wait in :attr:`unstored_ids`.
        """
        wall, mono, life = self.wall_clock(), self.monotonic(), self.life
        added = 0
        self.churn += len(ids)
        for task_id, expires_at in ids.items():
            if stored:
                self.unstored_ids.pop(task_id, None)
            elif task_id not in self.revoked:
                self.unstored_ids[task_id] = wall + self.default_expires
            if task_id in self.revoked:
                continue
            if expires_at is None:
                self.revoked.add(task_id)
            else:
                self.revoked.add(task_id, mono + (expires_at - wall) - life)
            added += 1
        trim_oldest(self.unstored_ids, self.max_entries)
        return added

    def note_revoked(self, task_ids: object, stored_until: object = None) -> int:
        """Note ids Celery's ``revoke`` command has just added; return how many wait to be stored.

        A storing client marks its broadcast with *stored_until*, the Unix time until
        which the store holds the ids: those need no writing back. A mark that is not a
        time between now and :data:`~..bounds.MAX_WAIT` ahead counts as no mark.
        """
        now = self.wall_clock()
        ids = [task_ids] if isinstance(task_ids, str) else task_ids
        if not isinstance(ids, list | tuple | set | frozenset):
            return 0
        self.churn += len(ids)
        until = expiry_of(stored_until)
        if until is not None and now < until <= now + MAX_WAIT:
            return 0
        noted = 0
        for task_id in ids:
            if valid_id(task_id) and task_id in self.revoked:
                self.unstored_ids[task_id] = now + self.default_expires
                noted += 1
        trim_oldest(self.unstored_ids, self.max_entries)
        return noted

    def merge_stamps(self, stamps: Mapping[Stamp, float | None], stored: bool) -> int:
        """Add stamped-header revokes; return how many were new."""
        wall = self.wall_clock()
        added = 0
        for (header, value), expires_at in stamps.items():
            expiry = expires_at or wall + self.default_expires
            if stored:
                self.known_stamps[(header, value)] = expiry
            current = self.revoked_stamps.get(header)
            values = (
                list(current)
                if isinstance(current, list | tuple)
                else ([] if current is None else [current])
            )
            if value in values:
                continue
            self.revoked_stamps[header] = [*values, value]
            self.stamp_expiry[(header, value)] = max(
                expiry, self.stamp_expiry.get((header, value), 0)
            )
            added += 1
        trim_oldest(self.known_stamps, self.max_entries)
        self._evict_stamps()
        return added

    def _evict_stamps(self) -> None:
        """Beyond :attr:`max_entries` merged stamps, drop the soonest-expiring (as the
        store and Celery's ``LimitedSet`` do)."""
        extra = len(self.stamp_expiry) - self.max_entries
        if extra <= 0:
            return
        for stamp, _expiry in sorted(self.stamp_expiry.items(), key=lambda kv: kv[1])[:extra]:
            del self.stamp_expiry[stamp]
            self._remove_stamp(*stamp)

    def expire(self) -> None:
        """Drop expired ids and the expired stamps merged here; forget long-expired known stamps."""
        self.revoked.purge(now=self.monotonic())
        now = self.wall_clock()
        for stamp, expiry in list(self.stamp_expiry.items()):
            if expiry <= now:
                del self.stamp_expiry[stamp]
                self._remove_stamp(*stamp)
        for stamp in [k for k, e in self.known_stamps.items() if e + KNOWN_GRACE < now]:
            del self.known_stamps[stamp]

    def _remove_stamp(self, header: str, value: object) -> None:
        current = self.revoked_stamps.get(header)
        values = list(current) if isinstance(current, list | tuple) else [current]
        remaining = [v for v in values if v != value]
        if remaining:
            self.revoked_stamps[header] = remaining
        else:
            self.revoked_stamps.pop(header, None)

    def local_stamps(self) -> Iterable[Stamp]:
        """Every valid ``(header, value)`` the worker holds."""
        for header, values in list(self.revoked_stamps.items()):
            for value in values if isinstance(values, list | tuple) else [values]:
                if valid_stamp(header, value):
                    yield (header, value)

    def adopt_held(self) -> int:
        """Note every id Celery's set holds now as waiting to be stored; return how many.

        At a worker's first load the set holds only what Celery itself loaded (a
        ``--statedb`` file): those are written to the store too, but for the ones the
        store turns out to hold.
        """
        ids, _ = self.held()
        self.unstored_ids.update(ids)
        trim_oldest(self.unstored_ids, self.max_entries)
        return len(ids)

    def unstored(self) -> tuple[dict[str, float], dict[Stamp, float]]:
        """Ids and stamps held here but not known to be in the store, with an expiry each.

        They are handed back once (the caller writes them, and retries on its own
        when that fails).
        """
        self.expire()
        now = self.wall_clock()
        ids = {i: e for i, e in self.unstored_ids.items() if i in self.revoked}
        self.unstored_ids = {}
        stamps = {
            stamp: self.stamp_expiry.get(stamp, now + self.default_expires)
            for stamp in self.local_stamps()
            if stamp not in self.known_stamps
        }
        self.known_stamps.update(stamps)
        trim_oldest(self.known_stamps, self.max_entries)
        return ids, stamps

    def held(self) -> tuple[dict[str, float], dict[Stamp, float]]:
        """Every unexpired id and stamp held here, with its expiry: what the store should hold.

        An id's expiry is read back from its insertion time in Celery's set (for an id
        merged from the store, that is the store's own expiry).
        """
        now, mono, life = self.wall_clock(), self.monotonic(), self.life
        ids = {}
        for task_id, inserted in self.revoked.as_dict().items():
            expires_at = now + (inserted + life - mono)
            if expires_at > now and valid_id(task_id):
                ids[task_id] = expires_at
        stamps = {s: e for s, e in self.known_stamps.items() if e > now}
        return ids, stamps

    def newest_ids(self, limit: int) -> list[str]:
        """Up to *limit* ids, the most recently added last (oldest evicted first on merge)."""
        ids = self.newest(self.revoked, limit)
        return [i for i in ids if isinstance(i, str) and len(i) <= MAX_ID_LENGTH]


def _newest(revoked: Any, limit: int) -> list[Any]:
    return list(revoked)[-limit:] if limit > 0 else []


def trim_oldest(entries: dict[Any, float], limit: int) -> None:
    """Drop the entries first inserted until at most *limit* remain."""
    extra = len(entries) - limit
    if extra > 0:
        for key in list(itertools.islice(entries, extra)):
            del entries[key]
