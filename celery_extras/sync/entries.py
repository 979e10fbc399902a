"""Validation of revoke entries read from the store or a neighbour: what is kept, what is dropped.

Everything that arrives from outside (store contents, neighbour replies,
control arguments) passes through here, so a malformed entry is counted and
dropped instead of reaching the worker's revoked set. No Celery import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..bounds import shown
from ..checks import is_int

__all__ = [
    "MAX_CLOCK",
    "MAX_ID_LENGTH",
    "Parsed",
    "Stamp",
    "expiry_of",
    "parse_expiring",
    "parse_ids",
    "parse_stamp_member",
    "parse_stamps",
    "stamp_member",
    "valid_clock",
    "valid_id",
    "valid_stamp",
]

#: Longest task id or stamp accepted (Celery's ids are 36-character UUIDs).
MAX_ID_LENGTH = 255

#: A stamped-header revoke: ``(header, value)``, e.g. ``("mtask_id", "abc")``.
Stamp = tuple[str, str | int | float | bool]


@dataclass
class Parsed:
    """What a validation pass kept (``{item: expires_at or None}``) and how many it dropped."""

    kept: dict[Any, float | None] = field(default_factory=dict)
    dropped: int = 0
    examples: list[str] = field(default_factory=list)

    def drop(self, what: object) -> None:
        self.dropped += 1
        if len(self.examples) < 3:
            self.examples.append(shown(what))

    def update(self, other: Parsed) -> None:
        """Add what *other* kept (its values win) and dropped."""
        self.kept.update(other.kept)
        self.add_drops(other)

    def add_drops(self, other: Parsed) -> None:
        """Count what *other* dropped (not what it kept)."""
        self.dropped += other.dropped
        self.examples = (self.examples + other.examples)[:3]


def valid_id(value: object) -> bool:
    """A task id: a non-empty string of at most :data:`MAX_ID_LENGTH` characters."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH


def valid_stamp(header: object, value: object) -> bool:
    """A stamp: a header name like an id, and a scalar JSON value (a string like an id)."""
    if not valid_id(header):
        return False
    if isinstance(value, str):
        return valid_id(value)
    if isinstance(value, bool | int):
        return True
    return isinstance(value, float) and math.isfinite(value)


#: Highest Lamport clock accepted from a neighbour or the store (18 digits: a forged
#: clock cannot push a worker's clock beyond what the store's counters hold).
MAX_CLOCK = 10**18 - 1


def valid_clock(value: object) -> bool:
    """A Lamport clock value: a non-negative integer up to :data:`MAX_CLOCK`."""
    return is_int(value, minimum=0, maximum=MAX_CLOCK)


def expiry_of(value: object) -> float | None:
    """A finite expiry timestamp, or ``None`` when *value* is not one."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value) if isinstance(value, str | int | float) else math.nan
    except (ValueError, OverflowError):  # not a number, or an int beyond any float
        return None
    return number if math.isfinite(number) else None


def stamp_member(header: str, value: str | int | float | bool) -> str:
    """The canonical JSON text of a stamp, used as its member in the store."""
    return json.dumps([header, value], separators=(",", ":"))


def parse_stamp_member(member: object) -> Stamp | None:
    """The stamp encoded by :func:`stamp_member`, or ``None`` when *member* is not one."""
    if not isinstance(member, str) or len(member) > 3 * MAX_ID_LENGTH:
        return None
    try:
        decoded = json.loads(member)
    except ValueError:
        return None
    if not isinstance(decoded, list) or len(decoded) != 2:
        return None
    header, value = decoded
    if not valid_stamp(header, value):
        return None
    return (header, value)


def _valid_stamp_pair(item: object) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and valid_stamp(item[0], item[1])


def parse_expiring(
    pairs: Iterable[tuple[object, object]], now: float, stamps: bool = False
) -> Parsed:
    """Task ids (or *stamps*) with their expiry, from ``(item, expires_at)`` pairs.

    Expired entries are skipped; malformed ones are dropped and counted.
    """
    parsed = Parsed()
    valid = _valid_stamp_pair if stamps else valid_id
    for task_id, raw_expiry in pairs:
        expires_at = expiry_of(raw_expiry)
        if not valid(task_id) or expires_at is None:
            parsed.drop((task_id, raw_expiry))
        elif expires_at > now:
            parsed.kept[task_id] = expires_at
    return parsed


def parse_ids(ids: object, limit: int) -> Parsed:
    """At most *limit* task ids from a neighbour's list (no expiry: the local one applies)."""
    parsed = Parsed()
    if not isinstance(ids, list | tuple):
        if ids is not None:
            parsed.drop(ids)
        return parsed
    for task_id in ids[:limit]:
        if valid_id(task_id):
            parsed.kept[task_id] = None
        else:
            parsed.drop(task_id)
    parsed.dropped += max(0, len(ids) - limit)
    return parsed


def parse_stamps(stamps: object, limit: int) -> Parsed:
    """At most *limit* stamps from ``[[header, value], ...]`` or ``{header: value | [values]}``."""
    parsed = Parsed()
    pairs: list[object] = []
    if isinstance(stamps, dict):
        for header, values in stamps.items():
            for value in values if isinstance(values, list | tuple) else [values]:
                pairs.append([header, value])
    elif isinstance(stamps, list | tuple):
        pairs = list(stamps)
    elif stamps is not None:
        parsed.drop(stamps)
    for pair in pairs[:limit]:
        if isinstance(pair, list | tuple) and len(pair) == 2 and valid_stamp(pair[0], pair[1]):
            parsed.kept[(pair[0], pair[1])] = None
        else:
            parsed.drop(pair)
    parsed.dropped += max(0, len(pairs) - limit)
    return parsed
