"""Global concurrency slots on Redis: leased holders, worker tickets, release notices.

Each bucket (a task and key) has three keys under one hash tag, so every script
runs on one Redis Cluster slot and buckets spread over the masters:

* ``holders``: a sorted set of holder ids scored by their lease's end, in
  milliseconds of the *Redis server's* clock (``TIME``), so workers' clocks do
  not matter. A holder past its lease is dropped by the next script that reads
  the bucket: the slot of a dead or partitioned worker comes back by itself.
* ``queue``: the workers waiting for a slot, one ticket each, oldest first. A
  free slot goes to the first tickets (a worker is served once, then goes to the
  back if it still waits), so no worker starves however fast the others are. A
  worker releasing a slot may hand it straight to its own next waiter (no round
  trip through the other workers) unless the first ticket has waited longer than
  a patience (:data:`HANDOVER_PATIENCE`), which bounds how long any worker waits
  beyond strict order.
  Tickets are scored by arrival (strictly increasing), not by name.
* ``tickets``: each ticket's lease (a dead waiter's ticket goes away).

Every key has a TTL and is deleted once the bucket is empty, so idle per-key
buckets cost nothing. A release with workers queued publishes the bucket on one channel;
workers with waiters on that bucket try again at once (no polling). Every worker hears
every notice, so a release nobody waits for is not published. The cap is handed
to the scripts (run-time caps sit in one hash, ``<prefix>:concurrency``, read
at most every :data:`CAP_REFRESH` seconds). No Celery import.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

from ..admission.notices import bucket_tag, notice
from ..admission.store_round import StoreCall, answered
from ..admission.stored_table import StoredTable
from ..checks import is_int
from ..clock import monotonic
from ..scripts import NOW, load, register
from .spec import MAX_CONCURRENCY

__all__ = [
    "ACQUIRE_SCRIPT",
    "CAP_REFRESH",
    "HANDOVER_PATIENCE",
    "RELEASE_SCRIPT",
    "RENEW_SCRIPT",
    "RedisSlots",
]

#: Seconds the first ticket of a queue may wait while a releasing worker hands its slot to
#: its own next waiter; after that, a free slot goes in queue order.
HANDOVER_PATIENCE = 1.0
#: Seconds the store trusts the run-time caps it read.
CAP_REFRESH = 1.0

#: Drops the holders past their lease and the dead tickets (``scripts/slots_prune.lua``).
_PRUNE = NOW + load("slots_prune")
# Each script's KEYS, ARGV and reply are documented atop its file in celery_extras/scripts/.
#: Take a slot, or queue the worker's ticket (``scripts/slots_acquire.lua``).
ACQUIRE_SCRIPT = _PRUNE + load("slots_acquire")
#: Free a slot, or hand it to the releasing worker's next waiter when the queue allows
#: (``scripts/slots_release.lua``).
RELEASE_SCRIPT = _PRUNE + load("slots_release")
#: Extend holders' leases (``scripts/slots_renew.lua``).
RENEW_SCRIPT = NOW + load("slots_renew")
#: Keep a worker's ticket alive, or drop it (``scripts/slots_ticket.lua``).
TICKET_SCRIPT = NOW + load("slots_ticket")


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _parse_cap(name: str, raw: Any) -> int | None:
    try:
        n = int(raw)
    except (TypeError, ValueError):
        return None
    return n if is_int(n, minimum=1, maximum=MAX_CONCURRENCY) else None


class RedisSlots:
    """Cluster-wide concurrency slots under *prefix* in *client*'s Redis (or Redis Cluster)."""

    def __init__(self, client: Any, prefix: str, clock: Callable[[], float] = monotonic) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self.caps_key = f"{prefix}:concurrency"
        self.channel = f"{prefix}:concurrency:released"
        self._acquire = register(client, ACQUIRE_SCRIPT)
        self._release = register(client, RELEASE_SCRIPT)
        self._renew = register(client, RENEW_SCRIPT)
        self._ticket = register(client, TICKET_SCRIPT)
        self._caps = StoredTable(client, self.caps_key, _parse_cap, CAP_REFRESH, clock)

    def keys(self, name: str, key: str = "") -> list[str]:
        """The bucket's keys: one hash tag (a digest of task and key) for all three."""
        base = f"{self.prefix}:conc:{bucket_tag(name, key)}"
        return [f"{base}:holders", f"{base}:queue", f"{base}:tickets"]

    def acquire(
        self, name: str, key: str, holder: str, cap: int, lease: float, worker: str,
        more: bool, ticket_lease: float,
    ) -> float:  # fmt: skip
        """Take a slot: ``0.0`` when taken, else seconds after which to ask again at the
        latest (a release notice usually comes first)."""
        return self.acquired(self.acquire_call(name, key, holder, cap, lease, worker, more,
                                               ticket_lease)())  # fmt: skip

    def acquire_call(
        self, name: str, key: str, holder: str, cap: int, lease: float, worker: str,
        more: bool, ticket_lease: float,
    ) -> StoreCall:  # fmt: skip
        """:meth:`acquire`'s script call, as data: it passes when the slot is taken."""
        args = (cap, holder, _ms(lease), worker, "1" if more else "0", _ms(ticket_lease))
        return StoreCall(self._acquire, tuple(self.keys(name, key)), args, "reply[1] == 1")

    @staticmethod
    def acquired(reply: Any) -> float:
        """:meth:`acquire`'s answer from its script's *reply* (raised if a round's error)."""
        reply = cast("list[Any]", answered(reply))
        return 0.0 if int(reply[0]) else int(reply[2]) / 1000

    @staticmethod
    def holders(reply: Any) -> int:
        """The bucket's holders, the take included, from :meth:`acquire`'s *reply*."""
        return int(cast("list[Any]", reply)[1])

    def release(self, name: str, key: str, holder: str) -> bool:
        """Free *holder*'s slot and tell the waiting workers; ``False`` if it held none."""
        found, _ = self.release_call(name, key, holder)()
        return bool(found)

    def release_call(self, name: str, key: str, holder: str) -> StoreCall:
        """:meth:`release`'s script call, as data."""
        return StoreCall(self._release, tuple(self.keys(name, key)),
                         (holder, self.channel, notice(name, key)))  # fmt: skip

    def hand_over(
        self, name: str, key: str, holder: str, next_holder: str, cap: int, lease: float,
        worker: str, more: bool, patience: float, ticket_lease: float,
    ) -> bool:  # fmt: skip
        """Free *holder*'s slot and give it to *next_holder* of the same worker if the
        queue allows (see :data:`RELEASE_SCRIPT`); ``True`` when handed over, else the slot
        is free and the waiting workers are told."""
        _, handed = self._release(
            keys=self.keys(name, key),
            args=[holder, self.channel, notice(name, key), next_holder, _ms(lease),
                  _ms(patience), worker, cap, "1" if more else "0", _ms(ticket_lease)],
        )  # fmt: skip
        return bool(handed)

    def renew(self, name: str, key: str, holders: list[str], lease: float) -> list[str]:
        """Extend the leases of *holders*; returns those whose lease had already run out."""
        lost = self._renew(keys=self.keys(name, key)[:1], args=[_ms(lease), *holders])
        return [h.decode() if isinstance(h, bytes) else str(h) for h in lost]

    def touch_ticket(self, name: str, key: str, worker: str, lease: float) -> bool:
        """Keep *worker*'s ticket of the bucket alive (it still waits); ``False`` when the
        store had dropped it (its lease ran out): the worker is no longer queued."""
        return bool(self._ticket(keys=self.keys(name, key)[1:], args=[_ms(lease), worker, "0"]))

    def leave(self, name: str, key: str, worker: str) -> None:
        """Drop *worker*'s ticket (it waits for nothing in the bucket any more)."""
        self._ticket(keys=self.keys(name, key)[1:], args=[1, worker, "1"])

    def holding(self, name: str, key: str = "") -> int:
        """Live holders of the bucket (for tests and ``extras concurrency --show``)."""
        holders = self.keys(name, key)[0]
        now_s, now_us = self.client.time()
        return int(self.client.zcount(holders, f"({now_s * 1000 + now_us // 1000}", "+inf"))

    # -- run-time caps ---------------------------------------------------------------------

    def caps(self) -> dict[str, int]:
        """The run-time caps in the store, read again once :data:`CAP_REFRESH` passed;
        entries that are not a count in bounds are skipped."""
        return self._caps.values()

    def set_cap(self, name: str, n: int | None) -> None:
        """Store (or with ``None`` remove) the run-time cap of task *name*."""
        self._caps.set(name, None if n is None else str(n))
