"""The limits' decisions, on an injected clock: which bucket, how long to wait, what to do.

:class:`LimitPlanner` books slots in a task's bucket (global on Redis through
:class:`~.redis_bucket.GlobalTokenBucket`, or local :class:`~.token_bucket.TokenBucket`),
applies run-time rates, falls back while the store is away (its
:class:`~celery_extras.store.health.StoreUser` logs that once per outage), and
:meth:`LimitPlanner.plan` says what to do with an arriving task: run it, hold it in
the worker, or park it in the delay store. No Celery import: the gate of the
admission pipeline is :mod:`.gate`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..admission.spec import call_key
from ..bounds import MAX_WAIT, shown
from ..store.health import StoreHealth, StoreUser, store_text
from .rate import format_rate, parse_burst, parse_rate
from .redis_bucket import GlobalTokenBucket, Override
from .spec import LimitSpec
from .token_bucket import TokenBucket

__all__ = ["LATE_CAP", "LATE_FLOOR", "LimitPlanner", "Plan"]

logger = logging.getLogger("celery_extras.limits.gate")

#: How late a booked slot may still be used: half the bucket's interval, so that no second
#: sees more than rate + burst runs, but at least :data:`LATE_FLOOR` (timer jitter must not
#: send every task of a fast bucket round again) and at most :data:`LATE_CAP` seconds.
#: A slot missed by more (the worker or the broker was away) is booked again: tasks
#: delayed by an outage must not all run at once when it ends.
LATE_FLOOR = 0.02
LATE_CAP = 0.5

_MAX_LOCAL_BUCKETS = 4096


@dataclass(frozen=True)
class Plan:
    """What to do with one task: ``run`` now, ``hold`` it *wait* s, or ``park`` it.

    ``due`` is when its slot comes (on the limiter's clock); ``verified`` marks a slot
    booked before and checked in the delay store (no new wait to report).
    """

    action: Literal["run", "hold", "park"]
    wait: float
    booked: bool
    due: float
    verified: bool = False
    #: booked on the fallback bucket while the store is away: booked again on the store if
    #: it answers before the slot comes (never parked: the store does not know the slot)
    fallback: bool = False


class LimitPlanner:
    """One worker's limits, decided on *clock*: buckets, run-time rates, store health.

    *global_bucket* builds the store's :class:`GlobalTokenBucket` when first needed;
    *store* reports its calls (by default a store health of this planner's own).
    """

    def __init__(
        self,
        settings: Mapping[str, Any],
        global_bucket: Callable[[], GlobalTokenBucket],
        clock: Callable[[], float] = time.monotonic,
        store: StoreUser | None = None,
    ) -> None:
        self.clock = clock
        self._make_bucket = global_bucket
        self.max_hold: float = settings["limit_max_hold"]
        self.on_store_error: str = settings["limit_on_store_error"]
        self.store_retry: float = settings["limit_store_retry"]
        self.specs: dict[str, LimitSpec] = {}
        self.overrides: dict[str, Override] = {}
        self.local: dict[tuple[str, str], TokenBucket] = {}
        if store is None:
            store = StoreHealth(self.store_retry, clock).user(logger, *self.outage_texts())
        self.store = store
        self._bucket: GlobalTokenBucket | None = None
        #: Latest global slot this worker booked per bucket, and the span (burst x interval)
        #: it covers: a fallback bucket starts after it, so an outage adds no second burst.
        self._last_slot: dict[tuple[str, str], tuple[float, float]] = {}

    # -- set-up --------------------------------------------------------------------------

    def register(self, name: str, spec: LimitSpec) -> None:
        self.specs[name] = spec

    def outage_texts(self) -> tuple[str, str]:
        """What this planner is called in the outage log, and what an outage does to it."""
        return (
            "global limits",
            f"they fall back to extras_limit_on_store_error={self.on_store_error!r} "
            "until it answers",
        )

    def global_bucket(self) -> GlobalTokenBucket:
        if self._bucket is None:
            self._bucket = self._make_bucket()
        return self._bucket

    def load_overrides(self) -> None:
        """Read the run-time rates stored by ``celery extras limit`` (bad entries are logged)."""
        try:
            stored = self.global_bucket().overrides()
        except Exception as exc:  # unreachable, a wrong-type key: the task's own limits apply
            logger.warning(
                "celery-extras: could not read run-time limits from the store: %s",
                store_text(exc),
            )
            return
        for name, raw in stored.items():
            try:
                self.overrides[name] = Override.loads(raw)
            except ValueError as exc:
                self.global_bucket().report_ignored(name, str(exc))
        for name in self.overrides:
            self._retune(name)

    # -- run-time rates --------------------------------------------------------------------

    def effective(self, name: str, spec: LimitSpec) -> tuple[float, int]:
        override = self.overrides.get(name)
        if override is None:
            return spec.rate, spec.burst
        return override.rate, override.burst or spec.burst

    def _retune(self, name: str) -> None:
        spec = self.specs.get(name)
        if spec is None:
            return
        rate, burst = self.effective(name, spec)
        for (task, _key), bucket in self.local.items():
            if task == name or task == f"fallback:{name}":
                bucket.set_rate(rate, burst)

    def set_limit(self, name: str, rate: object, burst: object = None) -> str:
        """Apply a new rate for *name* on this worker; :class:`ValueError` naming the culprit."""
        if not isinstance(name, str):
            raise ValueError(f"task_name {shown(name)}: expected a task name (a string)")
        spec = self.specs.get(name)
        if spec is None:
            raise ValueError(f"task {shown(name)} has no limit() on this worker")
        per_second = parse_rate(rate)
        checked = None if burst is None else parse_burst(burst)
        text = rate.strip() if isinstance(rate, str) else format_rate(per_second)
        self.overrides[name] = Override(per_second, checked, text)
        if self._bucket is not None:
            self._bucket.expire_overrides()
        self._retune(name)
        return f"{name}: {text} (burst {checked or spec.burst}, {spec.scope})"

    def reset_limit(self, name: object) -> str:
        """Drop the run-time rate of *name* on this worker: back to its ``limit()``."""
        if not isinstance(name, str) or name not in self.specs:
            raise ValueError(f"task {shown(name)} has no limit() on this worker")
        had = self.overrides.pop(name, None)
        self._retune(name)
        spec = self.specs[name]
        back = f"{name}: back to {spec.text} (burst {spec.burst}, {spec.scope})"
        return back if had is not None else back + "; it had no run-time rate"

    # -- deciding ----------------------------------------------------------------------------

    def key_of(self, name: str, spec: LimitSpec, request: Any) -> str:
        return call_key(name, spec.key, request, "limit", "bucket", logger)

    def _local(self, bucket_name: str, key: str, rate: float, burst: int) -> TokenBucket:
        bucket = self.local.get((bucket_name, key))
        if bucket is None:
            if len(self.local) >= _MAX_LOCAL_BUCKETS:
                for k in [k for k, b in self.local.items() if b.idle()]:
                    del self.local[k]
            bucket = self.local[(bucket_name, key)] = TokenBucket(rate, burst, self.clock)
        return bucket

    def wait_for(self, name: str, spec: LimitSpec, request: Any) -> tuple[float, bool]:
        """``(seconds to wait, slot booked)`` for *request*; unbooked waits must ask again."""
        key = self.key_of(name, spec, request)
        rate, burst = self.effective(name, spec)
        if spec.scope == "worker":
            return _bounded(self._local(name, key, rate, burst).reserve(max_wait=MAX_WAIT))
        if self.store.up():
            try:
                wait = self.global_bucket().reserve(name, rate, burst, key)
            except Exception as exc:  # whatever the store says, the consumer carries on
                self.store.failed(exc)
            else:
                self.store.answered()
                wait, booked = _bounded(wait)
                if booked:
                    wait = self._after_fallback(name, key, wait)
                    self._booked((name, key), self.clock() + wait, burst / rate)
                return wait, booked
        if self.on_store_error == "local":
            bucket = self._local(f"fallback:{name}", key, rate, burst)
            last = self._last_slot.get((name, key))
            if last is not None:
                bucket.charge_until(last[0])
            return _bounded(bucket.reserve(max_wait=MAX_WAIT))
        if self.on_store_error == "allow":
            return 0.0, True
        return self.store_retry, False  # "delay": wait, then ask the store again

    def _after_fallback(self, name: str, key: str, wait: float) -> float:
        """*wait*, or longer so the slot comes after those the fallback bucket handed out
        during an outage: a worker adds no global burst on top of its local debt."""
        fallback = self.local.get((f"fallback:{name}", key))
        if fallback is None:
            return wait
        now = self.clock()
        after = min(MAX_WAIT, fallback.booked_until() + fallback.interval - now)
        if after <= wait:
            return wait  # the store's own schedule has caught up
        fallback.charge_until(now + after)  # the next one comes an interval later
        return after

    def _booked(self, bucket: tuple[str, str], when: float, span: float) -> None:
        if len(self._last_slot) >= _MAX_LOCAL_BUCKETS:
            now = self.clock()
            for k in [k for k, (at, s) in self._last_slot.items() if at + s <= now]:
                del self._last_slot[k]
        last = self._last_slot.get(bucket)
        if last is None or when > last[0]:
            self._last_slot[bucket] = (when, span)

    def late_tolerance(self, name: str) -> float:
        """Seconds a booked slot of *name* may be used late (see :data:`LATE_FLOOR`)."""
        rate, _burst = self.effective(name, self.specs[name])
        return min(LATE_CAP, max(LATE_FLOOR, 0.5 / rate))

    def plan(self, name: str, request: Any, slot: float | None = None) -> Plan:
        """What to do with a task of *name* that arrived (or whose ETA passed) now.

        *slot* is the due time (on :attr:`clock`) of a slot booked for it before,
        verified by the delay store: it is used when it is still ahead, or passed by
        at most :meth:`late_tolerance`; otherwise the task books a new one.
        """
        if slot is not None:
            wait = slot - self.clock()
            if wait > 0:
                return Plan("hold", wait, True, slot, verified=True)
            if -wait <= self.late_tolerance(name):
                return Plan("run", 0.0, True, slot, verified=True)
        spec = self.specs[name]
        wait, booked = self.wait_for(name, spec, request)
        answered = self.clock()  # the slot is no earlier than this plus the wait
        if wait <= 0:
            return Plan("run", 0.0, booked, answered)
        fallback = booked and self.store.down and spec.scope == "global"
        if wait > self.max_hold and booked and not fallback:
            return Plan("park", wait, booked, answered + wait)
        return Plan("hold", wait, booked, answered + wait, fallback=fallback)


def _bounded(wait: float) -> tuple[float, bool]:
    """``(wait, booked)`` of a bucket's answer: a wait beyond :data:`MAX_WAIT` booked
    nothing, so the task waits that long and then asks again."""
    if wait > MAX_WAIT or wait != wait:
        return MAX_WAIT, False
    return max(wait, 0.0), True
