"""Merging revokes into the worker's own state: Celery's ``revoked`` set and ``revoked_stamps``.

An id that arrives with an expiry (from the store) is stamped so that Celery's
:class:`~celery.utils.collections.LimitedSet` expires it at that very time; an id
without one (from a neighbour) gets the set's own expiry, as Celery's Mingle does.
Stamps have no expiry in Celery; the ones merged here are removed when theirs
passes. What the worker holds beyond what the store is known to hold is what it
learnt from a broadcast alone: :meth:`WorkerRevokes.unstored` hands it back so it
can be written to the store. Runs in the consumer's thread only.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..bounds import MAX_WAIT
from ..compat import limited_set_items
from .entries import MAX_ID_LENGTH, Stamp, expiry_of, valid_id, valid_stamp

__all__ = ["KNOWN_GRACE", "WorkerRevokes"]

#: Seconds an entry stays "known to be stored" after its expiry, so clock skew
#: between Redis and this host never makes an expired revoke look new again.
KNOWN_GRACE = 60.0


class WorkerRevokes:
    """The worker's revoked ids and stamps, and which of them the store already holds."""

    def __init__(
        self,
        revoked: Any,
        revoked_stamps: dict[str, Any],
        default_expires: float,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        max_entries: int | None = None,
    ) -> None:
        self.revoked = revoked  # celery.utils.collections.LimitedSet
        self.revoked_stamps = revoked_stamps
        self.default_expires = default_expires
        #: Most entries of each structure below (and of stamps merged into Celery's
        #: ``revoked_stamps``): the revoked set's own ``maxlen``, as Celery bounds it.
        self.max_entries: int = max_entries or getattr(revoked, "maxlen", None) or 50_000
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        #: Ids known to be in the store, with their expiry; only those Celery's set still
        #: holds matter (see :meth:`_bound_known_ids`).
        self.known_ids: OrderedDict[str, float] = OrderedDict()
        self.known_stamps: dict[Stamp, float] = {}
        self.stamp_expiry: dict[Stamp, float] = {}

    def merge_ids(self, ids: Mapping[str, float | None], stored: bool) -> int:
        """Add *ids* (-> expiry, or ``None`` for the set's own); return how many were new.

        *stored* ids come from the store, which therefore need not be told of them.
        """
        wall, mono = self.wall_clock(), self.monotonic()
        life = self.revoked.expires or self.default_expires
        added = 0
        for task_id, expires_at in ids.items():
            if stored:
                self.known_ids[task_id] = expires_at or wall + self.default_expires
            if task_id in self.revoked:
                continue
            if expires_at is None:
                self.revoked.add(task_id)
            else:
                self.revoked.add(task_id, mono + (expires_at - wall) - life)
            added += 1
        self._bound_known_ids()
        return added

    def note_stored(self, task_ids: object, stored_until: object) -> int:
        """Mark *task_ids* as held by the store until *stored_until* (a Unix time), as a
        storing client says on its broadcast; return how many were marked.

        A mark that is not a time between now and :data:`~..bounds.MAX_WAIT` ahead, or
        ids that are not ids, mark nothing: the worker then writes them back as usual.
        """
        now = self.wall_clock()
        until = expiry_of(stored_until)
        if until is None or not now < until <= now + MAX_WAIT:
            return 0
        ids = [task_ids] if isinstance(task_ids, str) else task_ids
        if not isinstance(ids, list | tuple | set | frozenset):
            return 0
        marked = 0
        for task_id in ids:
            if valid_id(task_id):
                self.known_ids[task_id] = until
                marked += 1
        self._bound_known_ids()
        return marked

    def _bound_known_ids(self) -> None:
        """Keep at most :attr:`max_entries` known ids, forgetting first those Celery's set
        no longer holds (they can never be handed back).

        Celery's set evicts by time and this dict is in insertion order, so trimming the
        oldest here would forget ids the set still holds, and hand them back to a store
        that has them. Oldest first, an id gone from the set is dropped and one still
        held moves to the end (a second chance): each call's work is what it frees.
        """
        extra = len(self.known_ids) - self.max_entries
        for _ in range(len(self.known_ids) if extra > 0 else 0):
            task_id = next(iter(self.known_ids))
            if task_id in self.revoked:
                self.known_ids.move_to_end(task_id)
                continue
            del self.known_ids[task_id]
            extra -= 1
            if extra == 0:
                return
        _trim_oldest(self.known_ids, self.max_entries)  # the set holds more than max_entries

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
        _trim_oldest(self.known_stamps, self.max_entries)
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
        """Drop expired ids and the expired stamps merged here; forget long-expired known ones."""
        self.revoked.purge(now=self.monotonic())
        now = self.wall_clock()
        for stamp, expiry in list(self.stamp_expiry.items()):
            if expiry <= now:
                del self.stamp_expiry[stamp]
                self._remove_stamp(*stamp)
        for task_id in [k for k, e in self.known_ids.items() if e + KNOWN_GRACE < now]:
            del self.known_ids[task_id]
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

    def unstored(self) -> tuple[dict[str, float], dict[Stamp, float]]:
        """Ids and stamps held here but not known to be in the store, with an expiry each.

        They are marked as stored at once (the caller writes them, and retries
        on its own when that fails).
        """
        self.expire()
        now = self.wall_clock()
        ids = {
            task_id: now + self.default_expires
            for task_id in limited_set_items(self.revoked)
            if task_id not in self.known_ids and valid_id(task_id)
        }
        stamps = {
            stamp: self.stamp_expiry.get(stamp, now + self.default_expires)
            for stamp in self.local_stamps()
            if stamp not in self.known_stamps
        }
        self.known_ids.update(ids)
        self.known_stamps.update(stamps)
        self._bound_known_ids()
        _trim_oldest(self.known_stamps, self.max_entries)
        return ids, stamps

    def stored(self) -> tuple[dict[str, float], dict[Stamp, float]]:
        """The unexpired ids and stamps known to be in the store, with their expiry."""
        now = self.wall_clock()
        ids = {i: e for i, e in self.known_ids.items() if e > now and i in self.revoked}
        stamps = {s: e for s, e in self.known_stamps.items() if e > now}
        return ids, stamps

    def newest_ids(self, limit: int) -> list[str]:
        """Up to *limit* ids, the most recently added last (oldest evicted first on merge)."""
        ids = [i for i in limited_set_items(self.revoked)[-limit:] if isinstance(i, str)]
        return [i for i in ids if len(i) <= MAX_ID_LENGTH]


def _trim_oldest(entries: dict[Any, float], limit: int) -> None:
    """Drop the entries first inserted until at most *limit* remain."""
    extra = len(entries) - limit
    if extra > 0:
        for key in list(itertools.islice(entries, extra)):
            del entries[key]
