"""The delay store's rules, on an injectable clock: park, claim, release, take.

This is client-go's DelayingQueue for messages, split so that no worker keeps a
waiting message in memory and no leader is needed:

* **park** stores a whole message with the time it is due. Parking the same
  entry id again changes nothing (the id is derived from the message, so a
  message delivered twice is parked once).
* **claim** hands each due entry (due within *lead* seconds) to one mover with
  a fresh claim token and a lease: until the lease ends no other mover gets it;
  after that (the mover died) any mover claims it again, with another token.
* **release** tells the store that the claimed entry was published. The entry
  stays until a worker *takes* it; if none has after *recheck* seconds (the
  broker lost the message), it is due again and published again.
* **take** is what a worker does with a published message before running it.
  The first message of an entry, carrying a token the store issued, takes it
  and learns how far away its due time is (its booked slot); the same message
  delivered again takes it again (``REDELIVERED``); any other copy (published
  twice because a mover died between publishing and releasing) is a
  ``DUPLICATE`` and is dropped; a message naming no entry, the wrong task or a
  token the store never issued is ``UNKNOWN``: it is an ordinary message, with
  no booked slot. Taken entries leave a small tombstone for *tombstone_ttl*.

:class:`MemoryDelayStore` implements these rules in a dict and is the reference
the Redis scripts are tested against. :class:`Mover` is the loop every worker
runs. No Celery import.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

from .entry import Entry

__all__ = [
    "Claim",
    "Claimed",
    "DelayStore",
    "MemoryDelayStore",
    "Mover",
    "Take",
    "Taken",
    "TaskSummary",
]

logger = logging.getLogger(__name__)


class Take(IntEnum):
    """What a worker learns when it takes the entry a message names."""

    UNKNOWN = 0  # no such entry, wrong task or token: an ordinary message, no booked slot
    TAKEN = 1  # first message of the entry: run it (in its slot, for a limited task)
    REDELIVERED = 2  # the message that took it, delivered again: run it (slot passed)
    DUPLICATE = 3  # another copy of a taken entry: drop it


@dataclass(frozen=True)
class Taken:
    status: Take
    due_in: float = 0.0  # seconds from now to the entry's due time (negative: passed)
    kind: str = ""


@dataclass(frozen=True)
class Claim:
    """One entry handed to a mover: publish ``raw`` (an :class:`Entry`) under ``token``."""

    entry_id: str
    token: str
    attempt: int
    raw: str
    due_in: float


@dataclass(frozen=True)
class Claimed:
    items: list[Claim]
    next_in: float | None  # seconds until the next entry is due (None: store empty)


@dataclass
class TaskSummary:
    parked: int = 0
    next_in: float | None = None


class DelayStore(Protocol):
    """What the glue and the movers need from a delay store (Redis or memory)."""

    def park(self, entry_id: str, entry: Entry, delay: float) -> bool:
        """Store *entry* due in *delay* seconds; ``False`` if the id is known already."""
        ...

    def claim(self, lead: float, lease: float, tokens: list[str]) -> Claimed:
        """Claim up to ``len(tokens)`` entries due within *lead* seconds, one token each."""
        ...

    def release(self, entry_id: str, token: str, recheck: float) -> bool:
        """The claim *token* of *entry_id* was published; re-publish after *recheck* s."""
        ...

    def take(self, entry_id: str, task_id: str, token: str) -> Taken:
        """A worker received the message published under *token* for *entry_id*."""
        ...

    def discard(self, entry_id: str) -> None:
        """Drop an entry that cannot be published (it is not valid)."""
        ...

    def depth(self) -> int:
        """Entries parked and not yet taken."""
        ...

    def summary(self) -> dict[str, TaskSummary]:
        """Parked entries per task name, with the time until the next is due."""
        ...


#: Most claim tokens an entry remembers (each claim adds one; a later one re-publishes).
MAX_TOKENS = 32


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


class MemoryDelayStore:
    """The rules above in one process's memory, on *clock* (seconds)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, tombstone_ttl: float = 86400.0
    ) -> None:
        self.clock = clock
        self.tombstone_ttl = tombstone_ttl
        self.records: dict[str, _Record] = {}

    def park(self, entry_id: str, entry: Entry, delay: float) -> bool:
        if entry_id in self.records:
            return False
        due = self.clock() + max(0.0, delay)
        self.records[entry_id] = _Record(
            entry.task_id, entry.task, entry.kind, due, due, entry.dumps()
        )
        return True

    def _prune(self, now: float) -> None:
        for entry_id in [
            i for i, r in self.records.items()
            if r.taken_by is not None and r.taken_at <= now - self.tombstone_ttl
        ]:  # fmt: skip
            del self.records[entry_id]

    def claim(self, lead: float, lease: float, tokens: list[str]) -> Claimed:
        now = self.clock()
        waiting = sorted((r.score, i) for i, r in self.records.items() if r.taken_by is None)
        items: list[Claim] = []
        for score, entry_id in waiting:
            if len(items) >= len(tokens) or score > now + lead:
                break
            record = self.records[entry_id]
            token = tokens[len(items)]
            record.tokens = [*record.tokens, token][-MAX_TOKENS:]
            record.score = now + lease
            assert record.raw is not None
            items.append(
                Claim(entry_id, token, len(record.tokens), record.raw, _until(record.due, now))
            )
        self._prune(now)
        scores = [r.score for r in self.records.values() if r.taken_by is None]
        return Claimed(items, _until(min(scores), now) if scores else None)

    def release(self, entry_id: str, token: str, recheck: float) -> bool:
        record = self.records.get(entry_id)
        if record is None or record.taken_by is not None or record.tokens[-1:] != [token]:
            return False
        record.score = self.clock() + recheck
        return True

    def take(self, entry_id: str, task_id: str, token: str) -> Taken:
        record = self.records.get(entry_id)
        if record is None or record.task_id != task_id or token not in record.tokens:
            return Taken(Take.UNKNOWN)
        now = self.clock()
        if record.taken_by is not None:
            if record.taken_by == token:
                return Taken(Take.REDELIVERED, _until(record.due, now), record.kind)
            return Taken(Take.DUPLICATE, _until(record.due, now), record.kind)
        record.taken_by, record.taken_at, record.raw = token, now, None
        return Taken(Take.TAKEN, _until(record.due, now), record.kind)

    def discard(self, entry_id: str) -> None:
        self.records.pop(entry_id, None)

    def depth(self) -> int:
        return sum(1 for r in self.records.values() if r.taken_by is None)

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


class Mover:
    """One worker's mover: claims due entries, publishes them, releases them.

    *publish* sends one claimed entry (``Entry``, entry id, token) to its queue and
    raises when it cannot; the entry is then left claimed, and claimed again when
    its lease ends. :meth:`run_once` returns how long to sleep before the next turn.
    """

    def __init__(
        self,
        store: DelayStore,
        publish: Callable[[Entry, Claim], None],
        *,
        lead: float = 1.0,
        lease: float = 10.0,
        recheck: float = 600.0,
        batch: int = 100,
        poll: float = 0.5,
        on_released: Callable[[Entry, Claim], None] | None = None,
        new_token: Callable[[], str] = lambda: secrets.token_hex(16),
    ) -> None:
        self.store = store
        self.publish = publish
        self.lead = lead
        self.lease = lease
        self.recheck = recheck
        self.batch = batch
        self.poll = poll
        self.on_released = on_released
        self.new_token = new_token
        self.counts = {"claimed": 0, "released": 0, "publish_errors": 0, "invalid": 0}
        self.broker_down = False

    def run_once(self) -> float:
        """One turn; seconds to sleep before the next. Store errors propagate."""
        claimed = self.store.claim(self.lead, self.lease, [self.new_token() for _ in
                                                            range(self.batch)])  # fmt: skip
        self.counts["claimed"] += len(claimed.items)
        for claim in claimed.items:
            try:
                entry = Entry.loads(claim.raw)
            except ValueError as exc:
                self.counts["invalid"] += 1
                logger.error("celery-extras: dropping delay entry %s: %s", claim.entry_id, exc)
                self.store.discard(claim.entry_id)
                continue
            try:
                self.publish(entry, claim)
            except Exception as exc:
                self.counts["publish_errors"] += 1
                if not self.broker_down:
                    self.broker_down = True
                    logger.warning(
                        "celery-extras: the delay mover cannot publish (%r, %s[%s]); claimed "
                        "entries are claimed again when their lease of %.0f s ends (logged "
                        "once per outage)",
                        exc, entry.task, entry.task_id, self.lease,
                    )  # fmt: skip
                return self.poll  # the rest of the batch waits for its lease too
            if self.broker_down:
                self.broker_down = False
                logger.warning("celery-extras: the delay mover publishes again")
            self.store.release(claim.entry_id, claim.token, self.recheck)
            self.counts["released"] += 1
            if self.on_released is not None:
                self.on_released(entry, claim)
        if len(claimed.items) >= self.batch:
            return 0.0
        if claimed.next_in is None:
            return self.poll
        return min(self.poll, max(0.0, claimed.next_in - self.lead))

    def info(self) -> dict[str, Any]:
        return dict(self.counts)
