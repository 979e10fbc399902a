"""The delay store in one process's memory, on an injectable clock.

:class:`MemoryDelayStore` implements the rules of :mod:`.store` (park, claim,
release, take, purge) in a dict. It is the reference the Redis scripts
(:class:`~.redis_store.RedisDelayStore`) are tested against, and the store of
the unit tests. No Celery import.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..clock import monotonic
from .entry import Entry
from .store import (
    AHEAD_KINDS,
    HERD_WIDTH,
    MAX_TOKENS,
    PURGED_MARK,
    Claim,
    Claimed,
    Purged,
    Selection,
    Taken,
    TakeStatus,
    TaskSummary,
)

__all__ = ["MemoryDelayStore"]


def _until(at: float, now: float) -> float:
    """Seconds from *now* to *at*, to the microsecond: ``(now + d) - now`` in floating point
    can exceed *d* (a 30 s lease read back as 30.000000000000455 s)."""
    return round(at - now, 6)


@dataclass
class _Record:
    task_id: str
    name: str
    kind: str
    due: float
    score: float
    raw: str | None
    tokens: list[str] = field(default_factory=list)
    taken_by: str | None = None
    taken_at: float = 0.0
    released: bool = False  # published, waiting to be taken
    queue: str = ""  # the queue it counts for (Entry.counted_queue)


class MemoryDelayStore:
    """The rules above in one process's memory, on *clock* (seconds)."""

    def __init__(
        self, clock: Callable[[], float] = monotonic, tombstone_ttl: float = 86400.0
    ) -> None:
        self.clock = clock
        self.tombstone_ttl = tombstone_ttl
        self.records: dict[str, _Record] = {}

    def park(self, entry_id: str, entry: Entry, delay: float) -> bool:
        if entry_id in self.records:
            return False
        due = self.clock() + max(0.0, delay)
        self.records[entry_id] = _Record(
            entry.task_id, entry.task, entry.kind, due, due, entry.dumps(),
            queue=entry.counted_queue(),
        )  # fmt: skip
        return True

    def _prune(self, now: float) -> None:
        for entry_id in [
            i for i, r in self.records.items()
            if r.taken_by is not None and r.taken_at <= now - self.tombstone_ttl
        ]:  # fmt: skip
            del self.records[entry_id]

    def claim(
        self, lead: float, lease: float, tokens: list[str], lookahead: float = 0.0,
        window: int = 0, pace: float = 0.0,
    ) -> Claimed:  # fmt: skip
        now = self.clock()
        waiting = sorted((r.score, i) for i, r in self.records.items() if r.taken_by is None)
        chosen = [i for score, i in waiting if score <= now + lead][: len(tokens)]
        in_flight = sum(1 for r in self.records.values() if r.released and r.taken_by is None)
        if len(chosen) < len(tokens) and lookahead > lead and pace > 0 and in_flight < window:
            scores = [score for score, _ in waiting]
            chosen += [
                i for score, i in waiting
                if now + lead < score <= now + lookahead and not self.records[i].tokens
                and self.records[i].kind in AHEAD_KINDS
                and bisect.bisect_right(scores, score + HERD_WIDTH) > (score - now) * pace
            ][: len(tokens) - len(chosen)]  # fmt: skip
        items: list[Claim] = []
        for entry_id in chosen:
            record = self.records[entry_id]
            token = tokens[len(items)]
            record.tokens = [*record.tokens, token][-MAX_TOKENS:]
            record.score, record.released = now + lease, False
            assert record.raw is not None
            items.append(
                Claim(entry_id, token, len(record.tokens), record.raw, _until(record.due, now))
            )
        self._prune(now)
        scores = [r.score for r in self.records.values() if r.taken_by is None]
        return Claimed(items, _until(min(scores), now) if scores else None)

    def release(self, entry_id: str, token: str, recheck: float) -> bool:
        return self.release_all([(entry_id, token)], recheck) == 1

    def release_all(self, published: Iterable[tuple[str, str]], recheck: float) -> int:
        recorded = 0
        for entry_id, token in published:
            record = self.records.get(entry_id)
            if record is None or record.taken_by is not None or record.tokens[-1:] != [token]:
                continue
            record.score, record.released = self.clock() + recheck, True
            recorded += 1
        return recorded

    def take(self, entry_id: str, task_id: str, token: str) -> Taken:
        record = self.records.get(entry_id)
        if record is None or record.task_id != task_id or token not in record.tokens:
            return Taken(TakeStatus.UNKNOWN)
        now = self.clock()
        if record.taken_by is not None:
            if record.taken_by == token:
                return Taken(TakeStatus.REDELIVERED, _until(record.due, now), record.kind)
            if record.taken_by == PURGED_MARK:
                return Taken(TakeStatus.PURGED, _until(record.due, now), record.kind)
            return Taken(TakeStatus.DUPLICATE, _until(record.due, now), record.kind)
        record.taken_by, record.taken_at, record.raw = token, now, None
        record.released = False
        return Taken(TakeStatus.TAKEN, _until(record.due, now), record.kind)

    def discard(self, entry_id: str) -> None:
        self.records.pop(entry_id, None)

    def hurry(self, entry_id: str) -> bool:
        record = self.records.get(entry_id)
        if record is None or record.taken_by is not None or record.tokens:
            return False
        now = self.clock()
        if record.due > now:
            record.due = record.score = now
        return True

    def depth(self) -> int:
        return sum(1 for r in self.records.values() if r.taken_by is None)

    def shard_depths(self) -> dict[str, int]:
        return {"0": self.depth()}

    def parked_by_queue(self) -> dict[str, int]:
        """Entries not yet taken per queue they count for: the figures the Redis store's
        counts must equal."""
        out: dict[str, int] = {}
        for record in self.records.values():
            if record.taken_by is None and record.queue:
                out[record.queue] = out.get(record.queue, 0) + 1
        return out

    def summary(self) -> dict[str, TaskSummary]:
        now = self.clock()
        out: dict[str, TaskSummary] = {}
        for record in self.records.values():
            if record.taken_by is None:
                entry = out.setdefault(record.name, TaskSummary())
                entry.parked += 1
                due_in = _until(record.due, now)
                entry.next_in = due_in if entry.next_in is None else min(entry.next_in, due_in)
        return out

    def purged(self, entry_ids: Iterable[str]) -> dict[str, bool | None]:
        fates: dict[str, bool | None] = dict.fromkeys(entry_ids)
        for entry_id in fates:
            record = self.records.get(entry_id)
            if record is not None and record.taken_by in (None, PURGED_MARK):
                fates[entry_id] = record.taken_by == PURGED_MARK
        return fates

    def purge(self, selection: Selection) -> Purged:
        now = self.clock()
        parked = on_their_way = kept = 0
        for record in self.records.values():
            if record.taken_by is not None or record.raw is None:
                continue
            hit = record.name in selection.tasks
            if not hit and selection.by_queue:
                try:
                    entry = Entry.loads(record.raw)
                except ValueError:
                    continue  # left to the mover, which discards it
                hit = selection.matches(entry.task, entry.queue, entry.exchange,
                                        entry.routing_key)  # fmt: skip
                kept += not hit and not entry.queue
            if hit:
                if record.tokens:
                    on_their_way += 1
                else:
                    parked += 1
                record.taken_by, record.taken_at, record.raw = PURGED_MARK, now, None
                record.released = False
        return Purged(parked, on_their_way, kept)
