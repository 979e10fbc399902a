"""A token bucket shared by every worker: one atomic Lua script per acquire on Redis.

The script keeps each bucket as a theoretical arrival time (GCRA, the same
arithmetic as :class:`~celery_extras.limits.token_bucket.TokenBucket`) in
microseconds of the *Redis server's* clock (``TIME``), so workers whose clocks
disagree still share one exact rate. Each acquire admits one call under every
global limit of its task at once (the rule of :mod:`.all_of`) and returns the
exact wait (0: go now). A bucket key expires as soon as the bucket is full again,
so idle per-key buckets cost nothing.

A task with one global limit touches one key, its bucket
(``<prefix>:bucket:<task>:<key>``), so it runs on a Redis Cluster whatever slot the
bucket hashes to, and per-key buckets spread over every master. The buckets of a task
with several share its hash tag (``<prefix>:bucket:{<task>}:<limit>:<key>``): one slot,
one script. A rate changed at run time (``celery extras limit``)
sits in one hash, ``<prefix>:limits``, which the bucket reads at most every
:data:`OVERRIDE_REFRESH` seconds and hands to the script.

Each bucket object remembers the last slot it booked per bucket key and passes it
as a floor: if a failover dropped the bucket's last writes (asynchronous
replication), the new master's bucket starts no earlier than what this worker
already booked, so a lost write delays tasks instead of letting extra ones run.
No Celery import: the client is any ``redis.Redis`` or ``redis.RedisCluster``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..admission.store_round import StoreCall, answered
from ..admission.stored_table import StoredTable
from ..bounds import MAX_WAIT, shown
from ..clock import monotonic
from ..scripts import NOW, load, register
from .rate import check_rate, parse_burst

__all__ = [
    "ACQUIRE_SCRIPT",
    "OVERRIDE_REFRESH",
    "Acquired",
    "GlobalTokenBucket",
    "LimitTake",
    "Override",
    "override_field",
]

logger = logging.getLogger(__name__)

#: Seconds a bucket trusts the run-time rates it read from the store.
OVERRIDE_REFRESH = 1.0
#: Bucket keys whose last booked slot is remembered, at most (expired ones go first).
MAX_FLOORS = 4096

#: Admit one call under all its global limits, GCRA on the server's clock; KEYS, ARGV and
#: reply are documented atop ``scripts/bucket_acquire.lua``.
ACQUIRE_SCRIPT = NOW + load("bucket_acquire")


def override_field(limit: str, key: str = "") -> str:
    """Where the run-time rate of *limit* (a :func:`~.spec.limit_id`) is stored, for one
    *key* of it or (``""``) for all."""
    return json.dumps([limit, key]) if key else limit


@dataclass(frozen=True)
class LimitTake:
    """One limit's part in admitting one call: its bucket (limit id and key), its own rate
    and burst, the tokens the call takes, and whether the bucket is narrow (per key: it
    books its own slot at once, see :mod:`.all_of`)."""

    limit: str
    key: str
    rate: float
    burst: int
    tokens: int
    narrow: bool = False


@dataclass(frozen=True)
class Acquired:
    """What the store answered: the seconds to wait (0: every take was taken), the index of
    the enforcing take that makes the call wait that long (``None``: the floor does), each
    take's own wait, which takes were booked, and the next calls booked *ahead* (to be
    spent within the call's *horizon*, in seconds)."""

    wait: float
    binding: int | None
    waits: tuple[float, ...]
    booked: tuple[bool, ...]
    ahead: int = 0
    horizon: float = 0.0


class Override:
    """A rate (tasks per second) and optional burst set at run time for one task."""

    __slots__ = ("burst", "rate", "text")

    def __init__(self, rate: float, burst: int | None = None, text: str = "") -> None:
        self.rate = rate
        self.burst = burst
        self.text = text

    def dumps(self) -> str:
        return json.dumps({"rate": self.rate, "burst": self.burst, "text": self.text})

    @classmethod
    def loads(cls, raw: object) -> Override:
        """Parse a stored override; :class:`ValueError` naming what is wrong (briefly)."""
        try:
            data = json.loads(raw)  # type: ignore[arg-type]
            rate, burst, text = data["rate"], data.get("burst"), data.get("text")
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise ValueError(f"stored limit {shown(raw)} is not a JSON rate: {exc}") from None
        try:
            rate = check_rate(rate)
            if burst is not None:
                burst = parse_burst(burst)
        except ValueError as exc:
            raise ValueError(f"stored limit {shown(raw)}: {exc}") from None
        if not isinstance(text, str) or not 0 < len(text) <= 32:
            text = ""
        return cls(rate, burst, text)


class GlobalTokenBucket:
    """Cluster-wide token buckets under *prefix* in *client*'s Redis (or Redis Cluster)."""

    def __init__(self, client: Any, prefix: str, clock: Callable[[], float] = monotonic) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self.overrides_key = f"{prefix}:limits"
        self._acquire = register(client, ACQUIRE_SCRIPT)
        self._overrides = StoredTable(
            client, self.overrides_key, self._parse_override, OVERRIDE_REFRESH, clock
        )
        self._floors: dict[str, tuple[int, float]] = {}  # key -> (slot us, forget after)
        self._reported: set[str] = set()  # names whose ignored override was logged

    def bucket_key(self, name: str, key: str = "", task: str | None = None) -> str:
        """The bucket of limit *name* for *key*; with *task*, under the task's hash tag, so
        the buckets of a task with several limits lie in one slot of a Redis Cluster."""
        if task is None:
            return f"{self.prefix}:bucket:{name}:{key}"
        return f"{self.prefix}:bucket:{{{task}}}:{name}:{key}"

    def reserve(self, name: str, rate: float, burst: int, key: str = "", tokens: int = 1) -> float:
        """Book *tokens* of *name*'s bucket (for *key*); seconds to wait, 0 meaning go now."""
        return self.acquire(name, [LimitTake(name, key, rate, burst, tokens)]).wait

    def acquire(
        self,
        task: str,
        enforcing: Sequence[LimitTake],
        shadow: Sequence[LimitTake] = (),
        floor: float = 0.0,
        tagged: bool = False,
    ) -> Acquired:
        """Admit one call of *task* under its global limits, in one round trip: see
        ``scripts/bucket_acquire.lua``. *floor* is the wait its worker-scope limits ask;
        *tagged* (a task with several global limits) puts its buckets under its hash tag.

        A take's rate and burst are the limit's own; a rate stored for its limit (or for
        its limit and key) wins. Raises the client's :class:`redis.RedisError` when the
        store cannot answer.
        """
        call = self.acquire_call(task, enforcing, shadow, floor, tagged)
        return self.acquired(call, call())

    def acquire_call(self, task: str, enforcing: Sequence[LimitTake],
                     shadow: Sequence[LimitTake] = (), floor: float = 0.0,
                     tagged: bool = False, ahead: int = 0,
                     horizon: float = 0.0) -> StoreCall:  # fmt: skip
        """:meth:`acquire`'s script call, as data: it passes when the task goes now. When it
        does, up to *ahead* next calls are booked too, on slots the buckets let pass unused
        in the last *horizon* seconds (see ``scripts/bucket_acquire.lua``)."""
        tag = task if tagged else None
        keys = []
        args = [int(MAX_WAIT * 1_000_000), math.ceil(floor * 1_000_000), len(enforcing),
                ahead, int(horizon * 1_000_000)]  # fmt: skip
        for take in [*enforcing, *shadow]:
            rate, burst = self.effective(take)
            bucket = self.bucket_key(take.limit, take.key, tag)
            interval_us = max(1, math.ceil(1_000_000 / rate))
            keys.append(bucket)
            floor_us = self._floors.get(bucket, (0, 0.0))[0]
            args += [interval_us, burst, take.tokens, floor_us, int(take.narrow)]
        return StoreCall(self._acquire, tuple(keys), tuple(args), "reply[1] == 0")

    def acquired(self, call: StoreCall, reply: Any) -> Acquired:
        """:meth:`acquire`'s answer from the *reply* to its *call* (raised if a round's
        error): the slots it booked are remembered."""
        reply = cast("list[Any]", answered(reply))
        keys, args = call.keys, call.args
        booked = []
        for i, bucket in enumerate(keys):
            new_tat = int(reply[3 + 2 * i])
            booked.append(bool(new_tat))
            if new_tat:
                interval_us, burst = args[5 + 5 * i], args[6 + 5 * i]
                self._remember(bucket, new_tat, int(reply[2 + 2 * i]), interval_us, burst)
        binding = int(reply[1])
        return Acquired(
            wait=int(reply[0]) / 1_000_000,
            binding=binding - 1 if binding else None,
            waits=tuple(int(reply[2 + 2 * i]) / 1_000_000 for i in range(len(keys))),
            booked=tuple(booked),
            ahead=int(reply[2 + 2 * len(keys)]),
            horizon=args[4] / 1_000_000,
        )

    def effective(self, take: LimitTake) -> tuple[float, int]:
        """*take*'s rate and burst: a stored run-time rate of its limit and key, else of its
        limit, else the limit's own."""
        stored = self.stored_overrides()
        override = stored.get(override_field(take.limit, take.key)) if take.key else None
        if override is None:
            override = stored.get(take.limit)
        if override is None:
            return take.rate, take.burst
        return override.rate, override.burst or take.burst

    def _remember(self, bucket: str, slot: int, wait_us: int, interval: int, burst: int) -> None:
        now = self.clock()
        if len(self._floors) >= MAX_FLOORS:
            for k in [k for k, (_, until) in self._floors.items() if until < now]:
                del self._floors[k]
            if len(self._floors) >= MAX_FLOORS:
                self._floors.clear()
        # the slot stays relevant until the bucket would be full again after it
        self._floors[bucket] = (slot, now + (wait_us + burst * interval) / 1_000_000 + 1.0)

    def stored_overrides(self) -> dict[str, Override]:
        """The run-time rates in the store, read again once :data:`OVERRIDE_REFRESH` passed.

        Entries that do not parse are skipped (the enforcer logs them when it loads them).
        """
        return self._overrides.values()

    def _parse_override(self, task_name: str, raw: Any) -> Override | None:
        try:
            return Override.loads(raw)
        except ValueError:
            self.report_ignored(task_name, "out of bounds or not JSON")
            return None

    def report_ignored(self, name: str, reason: str) -> None:
        """Log, once per task name, that its stored override is ignored for *reason*."""
        if name in self._reported:
            return
        if len(self._reported) < 1024:
            self._reported.add(name)
        logger.error(
            "celery-extras: ignoring the stored run-time limit of %s (%s; see `celery extras "
            "limit`); the task's own limit applies",
            shown(name), reason,
        )  # fmt: skip

    def expire_overrides(self) -> None:
        """Read the stored run-time rates again at the next acquire (one was just changed)."""
        self._overrides.expire()

    def set_override(self, name: str, override: Override | None) -> None:
        """Store (or with ``None`` remove) the run-time rate of *name*."""
        self._overrides.set(name, None if override is None else override.dumps())

    def overrides(self) -> dict[str, str]:
        """Every stored run-time rate, raw: ``{task name: JSON}``."""
        return cast("dict[str, str]", self._overrides.raw())
