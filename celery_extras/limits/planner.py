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
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from ..admission.spec import call_key
from ..admission.store_round import StoreCall
from ..bounds import MAX_WAIT
from .all_of import admit_all
from .booked_ahead import BookedAhead
from .redis_bucket import Acquired, LimitTake
from .spec import CostError, LimitSpec, limit_id
from .token_bucket import TokenBucket
from .worker_limits import WorkerLimits

__all__ = ["AHEAD", "LATE_CAP", "LATE_FLOOR", "LimitPlanner", "Plan"]

logger = logging.getLogger("celery_extras.limits.gate")

#: How late a booked slot may still be used: half the bucket's interval, so that no second
#: sees more than rate + burst runs, but at least :data:`LATE_FLOOR` (timer jitter must not
#: send every task of a fast bucket round again) and at most :data:`LATE_CAP` seconds.
#: A slot missed by more (the worker or the broker was away) is booked again: tasks
#: delayed by an outage must not all run at once when it ends.
LATE_FLOOR = 0.02
LATE_CAP = 0.5

#: How much faster than its rate a worker-scope limit schedules the returns of the tasks
#: it parked: they come back to any worker, so each worker receives more than it can
#: run and none idles while another holds two (the surplus is held or parked again).
PARKED_PACE = 2.0

#: What :meth:`LimitPlanner.arrival_call` gives for a task admitted on a call booked ahead
#: (:mod:`.booked_ahead`): it goes now, the store unasked.
AHEAD: Any = object()


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What to do with one task: ``run`` now, ``hold`` it *wait* s, ``park`` it, or
    ``refuse`` it (its cost cannot be taken: *error* says why).

    ``due`` is when its slot comes (on the limiter's clock); ``verified`` marks a slot
    booked before and checked in the delay store (no new wait to report).
    """

    action: Literal["run", "hold", "park", "refuse"]
    wait: float
    booked: bool
    due: float
    verified: bool = False
    #: booked on the fallback bucket while the store is away: booked again on the store if
    #: it answers before the slot comes (never parked: the store does not know the slot)
    fallback: bool = False
    #: the limit whose slot was booked (its index among the task's), ``None`` when every
    #: limit was taken already (the wait is a fallback debt) or nothing was booked
    limit: int | None = 0
    #: the limit that made the task wait (what the stats say held it)
    held_by: int | None = None
    #: ``(index, seconds)`` of each shadow limit that would have held the task
    shadowed: tuple[tuple[int, float], ...] = ()
    #: the limits whose token a held task already holds (not asked again)
    taken: frozenset[int] = frozenset()
    error: str = ""

    @classmethod
    def held(cls, wait: float, now: float, limit: int | None, held_by: int, fallback: bool,
             max_hold: float) -> Plan:  # fmt: skip
        """Hold for *wait* in the worker, or park it when longer than *max_hold* (never a
        fallback slot: the store does not know it; never one of several limits taken)."""
        if wait > max_hold and not fallback and limit is not None:
            return cls(
                action="park", wait=wait, booked=True, due=now + wait, limit=limit, held_by=held_by
            )
        return cls(action="hold", wait=wait, booked=True, due=now + wait, fallback=fallback,
                   limit=limit, held_by=held_by)  # fmt: skip


@dataclass(frozen=True)
class _Call:
    """One limit as one call meets it: its index and spec, bucket key, rate, burst, cost."""

    index: int
    spec: LimitSpec
    id: str
    key: str
    rate: float
    burst: int
    cost: int

    def take(self) -> LimitTake:
        narrow = self.spec.key is not None  # one key's bucket: its own tasks queue in it
        return LimitTake(self.id, self.key, self.spec.rate, self.spec.burst, self.cost, narrow)


class LimitPlanner(WorkerLimits):
    """What to do with each arriving task of one worker's limits (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the next calls of a task whose limits do not bind, booked with one that goes now
        self.ahead = BookedAhead(self.clock)
        #: per task: whether its limits are all global and enforcing (but for limits_shadow),
        #: and the key of its calls booked ahead when every call has the same (see
        #: :func:`_fixed_ahead_key`: found without reading the call), else ``None``
        self._global: dict[str, bool] = {}
        self._fixed: dict[str, tuple[Any, ...] | None] = {}

    def register(self, name: str, specs: LimitSpec | tuple[LimitSpec, ...]) -> None:
        super().register(name, specs)
        self._global[name] = all(s.scope == "global" and not s.shadow for s in self.specs[name])
        self._fixed[name] = _fixed_ahead_key(name, self.specs[name]) if self._global[name] else None

    # -- deciding ----------------------------------------------------------------------------

    def _local(self, bucket_name: str, key: str, rate: float, burst: int) -> TokenBucket:
        return self.buckets.get(bucket_name, key, rate, burst)

    def _calls(self, name: str, request: Any) -> list[_Call]:
        """Each limit of *name* as *request* meets it; :class:`CostError` naming the limit."""
        calls = []
        for index, spec in enumerate(self.specs[name]):
            limit = limit_id(name, index)
            key = call_key(name, spec.key, request, "limit", "bucket", logger)
            rate, burst = self.effective(limit, key, spec)
            try:
                cost = spec.cost_of(request.args, request.kwargs, burst)
            except Exception as exc:
                raise CostError(f"task {name}, limit() {spec.text}: {exc}") from None
            calls.append(_Call(index, spec, limit, key, rate, burst, cost))
        return calls

    def late_tolerance(self, name: str, index: int | None = 0) -> float:
        """Seconds a booked slot of the *index*-th limit of *name* may be used late (see
        :data:`LATE_FLOOR`); every limit taken at once (``None``) takes the tightest."""
        specs = self.specs[name]
        chosen = range(len(specs)) if index is None else (index,)
        rate = max(self.effective(limit_id(name, i), "", specs[i])[0] for i in chosen)
        return min(LATE_CAP, max(LATE_FLOOR, 0.5 / rate))

    def arrival_call(self, name: str, request: Any) -> tuple[list[_Call], StoreCall] | Any:
        """The limits an arriving task of *name* meets, and :meth:`plan`'s store call as data
        (booking its next calls ahead when they come often); :data:`AHEAD` when it takes a
        call booked before; ``None`` unless the store alone decides (limits all global and
        enforcing, no cost refused, no fallback debt)."""
        specs = self.specs[name]
        if not self._global[name] or self.all_shadow or not self.store.up():
            return None
        bucket, calls = self._fixed.get(name), None
        if bucket is None:  # the call is read first: its keys and costs name its buckets
            calls = self._read(name, request)
            if calls is None:
                return None
            bucket = _ahead_key(name, calls)
        elif any(self.buckets.fell_back(limit, key) for limit, key, _ in bucket[1:]):
            return None
        if self.ahead.spend(bucket):
            return AHEAD
        calls = calls or self._read(name, request)
        if calls is None:
            return None
        # slots passed at most half the tightest late tolerance ago, spent within as long
        horizon = self.late_tolerance(name, None) / 2
        try:  # it reads the stored run-time rates now and then: the store may fail
            return calls, self.global_bucket().acquire_call(
                name, [c.take() for c in calls], (), 0.0, len(specs) > 1,
                self.ahead.wanted(bucket, horizon), horizon)  # fmt: skip
        except Exception as exc:  # plan() takes the outage's way
            self.store.failed(exc)
            return None

    def _read(self, name: str, request: Any) -> list[_Call] | None:
        """:meth:`_calls`, or ``None`` for a cost :meth:`plan` refuses or a fallback debt."""
        try:
            calls = self._calls(name, request)
        except CostError:
            return None
        return None if any(self.buckets.fell_back(c.id, c.key) for c in calls) else calls

    def plan(
        self,
        name: str,
        request: Any,
        slot: float | None = None,
        slot_limit: int | None = 0,
        taken: frozenset[int] = frozenset(),
        arrived: tuple[list[_Call], StoreCall, Any] | None = None,
    ) -> Plan:
        """What to do with a task of *name* that arrived (or whose ETA passed) now.

        *slot* is the due time (on :attr:`clock`) of a slot booked for it before in its
        *slot_limit*-th limit (``None``: in every limit), verified by the delay store: it
        is used when it is still ahead, or passed by at most :meth:`late_tolerance`;
        otherwise the task books a new one. *taken* are the limits whose token the task
        already holds from earlier slots: a slot used on time joins them, and they are
        not asked again (so a task under several limits waits at most one slot of each).
        *arrived*: what :meth:`arrival_call` gave, and the round's reply to its call.
        """
        if arrived is not None:
            calls, call, reply = arrived
            return self._decide(name, calls, [], verified=False, answered=(call, reply))
        if slot is not None:
            wait = slot - self.clock()
            if wait > 0:
                return Plan(action="hold", wait=wait, booked=True, due=slot, verified=True,
                            limit=slot_limit, taken=taken)  # fmt: skip
            if -wait > self.late_tolerance(name, slot_limit):
                taken = frozenset()  # missed: every limit is asked again
            elif slot_limit is None:
                return Plan(action="run", wait=0.0, booked=True, due=slot, verified=True,
                            limit=None)  # fmt: skip
            else:
                taken = taken | {slot_limit}
        try:
            calls = self._calls(name, request)
        except CostError as exc:
            return Plan(action="refuse", wait=0.0, booked=False, due=self.clock(), error=str(exc))
        enforcing = [c for c in calls if not self.shadow(c.spec) and c.index not in taken]
        shadows = [c for c in calls if self.shadow(c.spec)]
        plan = self._decide(name, enforcing, shadows, verified=bool(taken))
        if plan.action in ("hold", "park"):
            return replace(plan, taken=taken | plan.taken)
        return plan

    def _decide(
        self, name: str, enforcing: list[_Call], shadows: list[_Call], verified: bool,
        answered: tuple[StoreCall, Any] | None = None,
    ) -> Plan:  # fmt: skip
        local = [c for c in enforcing if c.spec.scope == "worker"]
        remote = [c for c in enforcing if c.spec.scope == "global"]
        shadow_local = [c for c in shadows if c.spec.scope == "worker"]
        shadow_remote = [c for c in shadows if c.spec.scope == "global"]
        if (remote or shadow_remote) and (answered is not None or self.store.up()):
            try:
                return self._admit(name, local, remote, shadow_local, shadow_remote, verified,
                                   answered=answered)  # fmt: skip
            except Exception as exc:  # whatever the store says, the consumer carries on
                self.store.failed(exc)
        if remote and self.on_store_error == "delay":  # wait, then ask the store again
            return Plan(action="hold", wait=self.store_retry, booked=False,
                        due=self.clock() + self.store_retry,
                        limit=None, held_by=remote[0].index)  # fmt: skip
        if self.on_store_error == "local":
            local, shadow_local = local + remote, shadow_local + shadow_remote
        return self._admit(name, local, [], shadow_local, [], verified, fallback=bool(remote))

    def _admit(
        self,
        name: str,
        local: list[_Call],
        remote: list[_Call],
        shadow_local: list[_Call],
        shadow_remote: list[_Call],
        verified: bool,
        fallback: bool = False,
        answered: tuple[StoreCall, Any] | None = None,
    ) -> Plan:
        """Admit one call under *local* buckets and the store's *remote* ones (fallback
        buckets stand in for those while the store is away): the rule of :mod:`.all_of`,
        where local buckets, like per-key ones, are narrow. *answered*: the store's call,
        made in a round, and its reply, read instead of asking."""
        buckets = [self._bucket_of(c, fallback) for c in local]
        waits = [
            b.expected_time(c.cost) if c.cost else 0.0 for b, c in zip(buckets, local, strict=True)
        ]
        wait = max(waits, default=0.0)
        if not fallback and self.max_hold < wait <= MAX_WAIT:
            # a worker's own bucket books at most a wait the worker holds: its slot is no
            # other worker's (fallback buckets book any wait: they are never parked)
            return self._parked_unbooked(local[_argmax(waits)], wait)
        binding = local[_argmax(waits)] if wait > 0 else None
        taken: set[int] = set()
        shadow_waits: list[tuple[int, float]] = []
        remote_booked: Iterable[tuple[_Call, bool, float]] = ()
        if remote or shadow_remote:
            acquired = _ask_store(self, name, remote, shadow_remote, wait, answered)
            wait = acquired.wait
            if acquired.binding is not None:
                binding = remote[acquired.binding]
            remote_booked = zip(remote, acquired.booked, acquired.waits, strict=False)
            shadow_waits = [
                (c.index, w)
                for c, w in zip(shadow_remote, acquired.waits[len(remote) :], strict=True)
            ]
        now = self.clock()
        for call, booked, own in remote_booked:
            if booked:  # the latest slot it booked here: a fallback bucket starts after it
                self.buckets.booked((call.id, call.key), now + own, call.burst / call.rate)
                taken.add(call.index)
        if wait > MAX_WAIT or math.isnan(wait):  # booked nothing: wait that long, ask again
            held_by = binding.index if binding else _first(remote + local)
            return Plan(action="hold", wait=MAX_WAIT, booked=False, due=now + MAX_WAIT, limit=None,
                        held_by=held_by)  # fmt: skip
        # the rule of all_of, the worker's buckets all narrow: each books its own slot
        narrow = admit_all([(b, c.cost, True) for b, c in zip(buckets, local, strict=True)],
                           floor=wait, max_wait=MAX_WAIT)  # fmt: skip
        taken.update(c.index for c, booked in zip(local, narrow.booked, strict=True) if booked)
        if wait > 0:
            binding = binding or (remote + local)[0]  # the store's wait, none binding named
            return _held_by(self, binding, wait, now, fallback, taken)
        # admitted: every limit is taken now; the shadow ones say what they would have done
        return _admitted(self, local, remote, shadow_local, shadow_waits, now, verified, fallback)

    def _parked_unbooked(self, call: _Call, wait: float) -> Plan:
        """A worker-scope limit makes the task wait longer than the worker holds: it is
        parked with no slot booked in the worker's bucket (the worker that receives it
        back, maybe another, asks its own bucket then). A schedule of such parks per
        bucket, after the bucket's own bookings, spreads their returns at the rate."""
        bucket = self._local(call.id, call.key, call.rate, call.burst)
        pace = call.rate * PARKED_PACE
        schedule = self._local(f"parked:{call.id}", call.key, pace, call.burst)
        schedule.charge_until(bucket.booked_until())
        wait = max(wait, min(MAX_WAIT, schedule.reserve(call.cost, MAX_WAIT)))
        now = self.clock()
        return Plan(action="park", wait=wait, booked=False, due=now + wait, limit=call.index,
                    held_by=call.index)  # fmt: skip

    def _bucket_of(self, call: _Call, fallback: bool) -> TokenBucket:
        if call.spec.scope == "worker" or not fallback:
            return self._local(call.id, call.key, call.rate, call.burst)
        return self.buckets.fallback(call.id, call.key, call.rate, call.burst)


def _ask_store(
    planner: LimitPlanner,
    name: str,
    remote: list[_Call],
    shadow_remote: list[_Call],
    floor: float,
    answered: tuple[StoreCall, Any] | None,
) -> Acquired:
    """The store's answer to the global calls of *name* (a round's reply when *answered*,
    else asked now with the local wait as *floor*), the calls it booked ahead kept."""
    store = planner.global_bucket()
    if answered is not None:  # a round's reply to its call
        acquired = store.acquired(*answered)
    else:
        several = sum(s.scope == "global" for s in planner.specs[name]) > 1
        takes = [c.take() for c in remote], [c.take() for c in shadow_remote]
        acquired = store.acquire(name, *takes, floor, several)
    planner.store.answered()
    if acquired.ahead:
        planner.ahead.booked(_ahead_key(name, remote), acquired.ahead, acquired.horizon)
    return acquired


def _held_by(
    planner: LimitPlanner, binding: _Call, wait: float, now: float, fallback: bool, taken: set[int]
) -> Plan:
    """The task waits *wait* s for *binding*'s slot (after the slots its fallback bucket
    handed out, unless the slot is that bucket's); the other limits in *taken* stay taken."""
    fell_back = fallback and binding.spec.scope == "global"
    if binding.spec.scope == "global" and not fell_back:
        wait = planner.buckets.after_fallback(binding.id, binding.key, wait)
    held = Plan.held(wait, now, binding.index, binding.index, fell_back, planner.max_hold)
    return replace(held, taken=frozenset(taken - {binding.index}))


def _admitted(
    planner: LimitPlanner,
    local: list[_Call],
    remote: list[_Call],
    shadow_local: list[_Call],
    shadow_waits: list[tuple[int, float]],
    now: float,
    verified: bool,
    fallback: bool,
) -> Plan:
    """A task every limit admitted: it runs, with what its shadow limits would have done,
    unless a fallback debt of its global limits makes it wait that out first."""
    for c in shadow_local:
        if c.cost:
            bucket = planner._bucket_of(c, fallback)
            shadow_waits.append((c.index, min(MAX_WAIT, bucket.reserve(c.cost, MAX_WAIT))))
    shadowed = tuple((i, w) for i, w in shadow_waits if w > 0)
    debt = max([0.0] + [planner.buckets.after_fallback(c.id, c.key, 0.0) for c in remote])
    if debt > 0:  # a fallback bucket handed out slots during an outage: wait them out
        only = remote[0].index if len(local) + len(remote) == 1 else None
        held = Plan.held(debt, now, only, remote[0].index, False, planner.max_hold)
        return replace(held, shadowed=shadowed)
    return Plan(action="run", wait=0.0, booked=True, due=now, verified=verified,
                shadowed=shadowed)  # fmt: skip


def _ahead_key(name: str, calls: list[_Call]) -> tuple[Any, ...]:
    """What calls booked ahead are kept under: the task, and its buckets and costs."""
    return name, *((c.id, c.key, c.cost) for c in calls)


def _fixed_ahead_key(name: str, specs: tuple[LimitSpec, ...]) -> tuple[Any, ...] | None:
    """:func:`_ahead_key` of every call of *name*, whose limits are global and enforcing,
    when none has a key or a cost per call, else ``None`` (each call is read)."""
    if any(s.key is not None or callable(s.cost) for s in specs):
        return None
    return name, *((limit_id(name, i), "", s.cost) for i, s in enumerate(specs))


def _first(calls: list[_Call]) -> int | None:
    return calls[0].index if calls else None


def _argmax(values: Any) -> int:
    listed = list(values)
    return max(range(len(listed)), key=listed.__getitem__)
