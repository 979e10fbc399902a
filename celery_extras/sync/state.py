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

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .entries import MAX_ID_LENGTH, Stamp, valid_id, valid_stamp

__all__ = ["WorkerRevokes"]

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
    ) -> None:
        self.revoked = revoked  # celery.utils.collections.LimitedSet
        self.revoked_stamps = revoked_stamps
        self.default_expires = default_expires
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        self.known_ids: dict[str, float] = {}
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
        return added

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
        return added

    def expire(self) -> None:
        """Drop expired ids and the expired stamps merged here; forget long-expired known ones."""
        self.revoked.purge()
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
            for task_id in list(self.revoked._data)
            if task_id not in self.known_ids and valid_id(task_id)
        }
        stamps = {
            stamp: self.stamp_expiry.get(stamp, now + self.default_expires)
            for stamp in self.local_stamps()
            if stamp not in self.known_stamps
        }
        self.known_ids.update(ids)
        self.known_stamps.update(stamps)
        return ids, stamps

    def newest_ids(self, limit: int) -> list[str]:
        """Up to *limit* ids, the most recently added last (oldest evicted first on merge)."""
        ids = [i for i in list(self.revoked._data)[-limit:] if isinstance(i, str)]
        return [i for i in ids if len(i) <= MAX_ID_LENGTH]
