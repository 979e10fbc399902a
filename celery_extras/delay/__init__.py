"""The delay store: waits longer than the prefetch window, parked outside the workers."""

from __future__ import annotations

from .entry import CLAIM_HEADER, PARKED_HEADER, Entry, due_queue_name, entry_id
from .memory_store import MemoryDelayStore
from .mover import Mover
from .redis_store import RedisDelayStore, delay_keys
from .store import Claim, Claimed, DelayStore, Purged, Selection, Taken, TakeStatus

__all__ = [
    "CLAIM_HEADER",
    "PARKED_HEADER",
    "Claim",
    "Claimed",
    "DelayStore",
    "Entry",
    "MemoryDelayStore",
    "Mover",
    "Purged",
    "RedisDelayStore",
    "Selection",
    "TakeStatus",
    "Taken",
    "delay_keys",
    "due_queue_name",
    "entry_id",
]
