"""The delay store's interface and rules: park, claim, release, take.

This is client-go's DelayingQueue for messages, split so that no worker keeps a
waiting message in memory and no leader is needed:

* **park** stores a whole message with the time it is due. Parking the same
  entry id again changes nothing (the id is derived from the message, so a
  message delivered twice is parked once).
* **claim** hands each due entry (due within *lead* seconds) to one mover with
  a fresh claim token and a lease: until the lease ends no other mover gets it;
  after that (the mover died) any mover claims it again, with another token.
  ETA and retry entries due within a longer *lookahead* are claimed too when
  they belong to a herd (more entries are due up to :data:`HERD_WIDTH` after
  their time than workers take at *pace* per second meanwhile), while fewer
  than *window* published entries wait to be taken: a herd due at once reaches
  the workers' timers ahead of its time, as Celery's own ETA tasks do, and a
  steady stream is never published early.
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
* **purge** drops the entries a :class:`Selection` names (those of some queues, for
  ``celery purge``; those of a task name, for ``celery extras delayed --drop``), whatever
  their state but taken: parked, claimed or released. Each leaves a tombstone, as a taken
  entry does, so a copy a mover published already is ``PURGED`` where a worker takes it
  (and dropped there), and the original message delivered again is not parked anew.

This module holds the interface: :class:`DelayStore` and the results its
methods return. :class:`~.memory_store.MemoryDelayStore` implements the rules
in a dict and is the reference the Redis scripts
(:class:`~.redis_store.RedisDelayStore`) are tested against;
:class:`~.mover.Mover` is the loop every worker runs. No Celery import.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from .entry import Entry

__all__ = [
    "AHEAD_KINDS",
    "HERD_WIDTH",
    "MAX_TOKENS",
    "PURGED_MARK",
    "Claim",
    "Claimed",
    "DelayStore",
    "Purged",
    "Selection",
    "TakeStatus",
    "Taken",
    "TaskSummary",
]


class TakeStatus(IntEnum):
    """What a worker learns when it takes the entry a message names."""

    UNKNOWN = 0  # no such entry, wrong task or token: an ordinary message, no booked slot
    TAKEN = 1  # first message of the entry: run it (in its slot, for a limited task)
    REDELIVERED = 2  # the message that took it, delivered again: run it (slot passed)
    DUPLICATE = 3  # another copy of a taken entry: drop it
    PURGED = 4  # a copy of an entry purged (``celery purge``, ``--drop``): drop it


@dataclass(frozen=True)
class Taken:
    status: TakeStatus
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


@dataclass(frozen=True)
class Selection:
    """The entries a purge drops: those recording a queue of *queues*; those recording no
    queue (the worker that parked it consumed none its route names) whose ``(exchange,
    routing key)`` is one of *routes*; and those of a task named in *tasks*."""

    queues: frozenset[str] = frozenset()
    routes: frozenset[tuple[str, str]] = frozenset()
    tasks: frozenset[str] = frozenset()

    @property
    def by_queue(self) -> bool:
        """Whether it names queues (then entries recording none and not named are counted
        as :attr:`Purged.kept`)."""
        return bool(self.queues or self.routes)

    def matches(self, task: str, queue: str | None, exchange: str, routing_key: str) -> bool:
        if task in self.tasks:
            return True
        if queue:
            return queue in self.queues
        return (exchange, routing_key) in self.routes

    def dumps(self) -> str:
        """The JSON the purge script reads (``scripts/delay_purge.lua``)."""
        return json.dumps(
            {"q": sorted(self.queues), "r": [list(r) for r in sorted(self.routes)],
             "n": sorted(self.tasks)},
            separators=(",", ":"),
        )  # fmt: skip


@dataclass(frozen=True)
class Purged:
    """What a purge dropped: entries still *parked* (waiting for their time), and entries
    *on their way* (claimed or released: a copy published, or about to be, is dropped by the
    worker that receives it); and the entries *kept* that record no queue and whose route
    the selection does not name."""

    parked: int = 0
    on_their_way: int = 0
    kept: int = 0

    @property
    def dropped(self) -> int:
        return self.parked + self.on_their_way

    def __add__(self, other: Purged) -> Purged:
        return Purged(self.parked + other.parked, self.on_their_way + other.on_their_way,
                      self.kept + other.kept)  # fmt: skip


class DelayStore(Protocol):
    """What the glue and the movers need from a delay store (Redis or memory)."""

    def park(self, entry_id: str, entry: Entry, delay: float) -> bool:
        """Store *entry* due in *delay* seconds; ``False`` if the id is known already."""
        ...

    def claim(
        self, lead: float, lease: float, tokens: list[str], lookahead: float = 0.0,
        window: int = 0, pace: float = 0.0,
    ) -> Claimed:  # fmt: skip
        """Claim up to ``len(tokens)`` entries due within *lead* seconds, one token each,
        then the ETA and retry entries of a herd due within *lookahead* (see above)."""
        ...

    def release(self, entry_id: str, token: str, recheck: float) -> bool:
        """The claim *token* of *entry_id* was published; re-publish after *recheck* s."""
        ...

    def release_all(self, published: Iterable[tuple[str, str]], recheck: float) -> int:
        """:meth:`release` for each ``(entry id, token)``, at once; how many were recorded."""
        ...

    def take(self, entry_id: str, task_id: str, token: str) -> Taken:
        """A worker received the message published under *token* for *entry_id*."""
        ...

    def discard(self, entry_id: str) -> None:
        """Drop an entry that cannot be published (it is not valid)."""
        ...

    def hurry(self, entry_id: str) -> bool:
        """Make a parked entry due now; ``False`` when unknown or already on its way."""
        ...

    def depth(self) -> int:
        """Entries parked and not yet taken."""
        ...

    def shard_depths(self) -> dict[str, int]:
        """:meth:`depth` per shard, by name (``"0"``: the first)."""
        ...

    def summary(self) -> dict[str, TaskSummary]:
        """Parked entries per task name, with the time until the next is due."""
        ...

    def parked_by_queue(self) -> dict[str, int]:
        """Entries not yet taken (parked, claimed or released) per queue they count for
        (:meth:`.Entry.counted_queue`), from counts the store keeps: no walk of the entries.
        Entries parked by a release before these counts are not in them."""
        ...

    def purge(self, selection: Selection) -> Purged:
        """Drop the entries not yet taken that *selection* names (see above)."""
        ...

    def purged(self, entry_ids: Iterable[str]) -> dict[str, bool | None]:
        """What became of each of *entry_ids*: ``True`` dropped by a purge (its tombstone
        says so), ``False`` not yet taken, ``None`` taken or unknown (a key-run gate learns
        this way that a waiting run it parked was purged: :mod:`~celery_extras.keyed.purged`)."""
        ...


#: Kinds of entries published ahead within the lookahead (their messages carry their ETA).
AHEAD_KINDS = frozenset({"eta", "retry"})

#: Entries due within this many seconds of each other are one herd (``delay_claim.lua``).
HERD_WIDTH = 1.0

#: Most claim tokens an entry remembers (each claim adds one; a later one re-publishes).
MAX_TOKENS = 32

#: What a purged entry's tombstone holds where a taken one holds the token that took it (no
#: claim token has a ``!``).
PURGED_MARK = "!purged"
