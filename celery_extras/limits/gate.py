"""Limits enforced in the worker's main process, before a task reaches the pool.

The decisions are :class:`~.limiter.Limiter`'s, on an injected clock; this module
carries them out with Celery.

A limited task's strategy is Celery's own (or the task's), given a consumer
whose ``on_task_request`` and ``apply_eta_task`` pass through the
:class:`Enforcer` first. Each arriving task books a slot in its bucket (global
on Redis, or local) and then:

* runs now when the slot is now;
* is *held* in the worker's timer when the wait is at most ``extras_limit_max_hold``:
  it takes no pool slot, and the prefetch window is widened while it waits (as
  Celery does for ETA tasks) so other tasks keep flowing;
* is *parked* in the delay store otherwise (:mod:`celery_extras.delay`): the
  whole message is stored with its booked slot, and only then acked; a mover
  publishes it again shortly before the slot, and the worker that receives it
  checks the slot against the store before it runs it there (a header alone
  books nothing).

Held messages stay unacked, so a worker killed while holding them loses none:
the broker delivers them again. Waits are reported with
:data:`celery_extras.signals.task_rate_limited`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery, Task
from celery.utils.imports import instantiate, symbol_by_name
from celery.worker.strategy import default as default_strategy

from .. import compat
from ..admission.registry import policies_of
from ..concurrency.gate import SLOTS_ATTR, SlotConsumer
from ..delay.gate import DELAY_ATTR
from ..signals import task_rate_limited
from ..store import redis_client, store_key
from .planner import LATE_CAP, LATE_FLOOR, Limiter
from .rate import format_rate
from .redis_bucket import GlobalBucket
from .spec import LimitSpec

__all__ = [
    "ENFORCER_ATTR",
    "LATE_CAP",
    "LATE_FLOOR",
    "Enforcer",
    "GatedConsumer",
    "limited_strategy",
]

logger = logging.getLogger(__name__)

#: Attribute of the consumer holding its :class:`Enforcer`.
ENFORCER_ATTR = "extras_policies"


#: ``(task, rate)`` pairs whose stored rate this process has logged (see Enforcer.announce).
_announced: set[tuple[str, str]] = set()


def _no_reserve(request: Any) -> None:
    """Stand-in for ``task_reserved`` in the strategy: the enforcer reserves at go time."""


class Enforcer(Limiter):
    """The limits in a worker's consumer: :class:`Limiter`'s plans, carried out with Celery
    (the pool, the timer, the prefetch window, the delay store)."""

    def __init__(
        self, app: Celery, settings: Mapping[str, Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(settings, lambda: GlobalBucket(redis_client(app), store_key(app)), clock)
        self.app = app
        self.held: dict[int, tuple[Any, Any]] = {}
        self.connection_epoch = 0  # stop() counts the connections lost
        #: held: fresh waits held in the worker; parked: fresh waits parked; slot_holds:
        #: released tasks held for the rest of their verified slot (no new wait)
        self.counts.update({"admitted": 0, "held": 0, "parked": 0, "slot_holds": 0})

    def register(self, name: str, spec: LimitSpec) -> None:
        super().register(name, spec)
        self.announce(name)

    def announce(self, *names: str) -> None:
        """Log, once per task and rate in this process, a stored rate replacing a ``limit()``.

        Called as the overrides are loaded and as each task registers: the consumer
        builds the tasks' strategies before or after this step starts, as Celery orders
        steps that do not require each other.
        """
        for name in sorted(names):
            override, spec = self.overrides.get(name), self.specs.get(name)
            if override is None or spec is None:
                continue
            text = override.text or format_rate(override.rate)
            if (name, text) in _announced:
                continue
            _announced.add((name, text))
            logger.warning(
                "celery-extras: %s runs at the stored rate %s%s, not its limit() %s "
                "(set with `celery extras limit`; `celery extras limit --reset %s` restores it)",
                name, text, f" burst {override.burst}" if override.burst else "", spec.text, name,
            )  # fmt: skip

    def stop(self) -> None:
        """Drop held tasks (connection lost or shutting down): the broker delivers them again."""
        self.connection_epoch += 1  # ETA timers of the lost connection must not run its tasks
        for request, entry in list(self.held.values()):
            entry.cancel()
            compat.forget_held(request)
        self.held.clear()

    # -- acting ------------------------------------------------------------------------------

    def submit(self, consumer: Any, request: Any, name: str) -> None:
        """A task of *name* arrived (or its ETA passed): run, hold, or park it."""
        gate = getattr(consumer, DELAY_ATTR, None)
        plan = self.plan(name, request, gate.pop_slot(request.id) if gate is not None else None)
        if plan.action == "run":
            self.go(consumer, request)
            return
        if not plan.verified:
            task_rate_limited.send(sender=name, request=request, wait=plan.wait)
        if plan.action == "park" and gate is not None and self.park(gate, request, name, plan.due):
            return
        self.hold(consumer, request, name, plan.wait, plan.booked, plan.due, plan.fallback)
        if plan.verified:
            self.counts["held"] -= 1
            self.counts["slot_holds"] += 1

    def after_eta(self, consumer: Any, request: Any, name: str) -> None:
        """The ETA of a task passed: it books a slot now (or uses the one it was parked with)."""
        self.submit(consumer, request, name)

    def go(self, consumer: Any, request: Any) -> None:
        self.counts["admitted"] += 1
        compat.task_reserved(request)
        consumer.on_task_request(request)

    def hold(
        self,
        consumer: Any,
        request: Any,
        name: str,
        wait: float,
        booked: bool,
        due: float | None = None,
        fallback: bool = False,
    ) -> None:
        self.counts["held"] += 1
        compat.widen_prefetch(consumer)  # keep the prefetch window open while it waits
        if due is None:
            due = self.clock() + wait
        entry = consumer.timer.call_after(
            wait, self._release, (consumer, request, name, booked, due, fallback), priority=6
        )
        self.held[id(request)] = (request, entry)
        compat.track_held(request, entry)  # so Celery's on_close() cancels it too (5.7+)

    def _release(
        self, consumer: Any, request: Any, name: str, booked: bool, due: float,
        fallback: bool = False,
    ) -> None:  # fmt: skip
        if self.held.pop(id(request), None) is None:
            return  # dropped by stop()
        compat.narrow_prefetch(consumer)
        if fallback and (not self._down or self.clock() >= self._down_until):
            # the store is back, or may be: its bucket never saw this slot, so a slot there
            # replaces it (running on both would exceed the limit after a failover)
            self.submit(consumer, request, name)
        elif booked and self.clock() - due <= self.late_tolerance(name):
            self.go(consumer, request)
        else:
            self.submit(consumer, request, name)

    def park(self, gate: Any, request: Any, name: str, slot: float) -> bool:
        """Park *request*'s message with its booked *slot* (on :attr:`clock`) in the delay
        store, then ack it. The store's due time is the slot itself: the time spent between
        booking and parking is taken off the wait, so a parked task is not later than its
        slot (a later one would crowd the slots booked after it).

        ``False`` (and nothing acked) when it cannot be parked, or no replica acknowledged
        the park where one must (``extras_delay_park_replicas``); the caller then holds it.
        """
        message = request.message
        headers = message.headers or {}
        if "task" not in headers or "id" not in headers:
            return False  # protocol 1 message: hold it instead
        eid, entry = gate.parker.entry_of_message(message, name, "limit")
        if not gate.parker.park(eid, entry, slot - self.clock(), request):
            return False
        self.counts["parked"] += 1
        request.acknowledge()
        return True

    def info(self) -> dict[str, Any]:
        limits = {}
        for name, spec in self.specs.items():
            entry = spec.describe()
            override = self.overrides.get(name)
            if override is not None:
                entry["override"] = override.text or format_rate(override.rate)
                if override.burst:
                    entry["burst"] = override.burst
            limits[name] = entry
        return {
            "limits": limits,
            "waiting": len(self.held),
            **self.counts,
            "store": "down" if self._down else "ok",
            **({"store_error": self._store_error} if self._down else {}),
            "on_store_error": self.on_store_error,
            "max_hold": self.max_hold,
        }


class GatedConsumer:
    """The consumer as a limited task's strategy sees it: requests go through the enforcer."""

    def __init__(self, consumer: Any, enforcer: Enforcer, name: str) -> None:
        self._consumer = consumer
        self._enforcer = enforcer
        self._name = name
        self._epoch = enforcer.connection_epoch  # strategies are built anew per connection

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._consumer, attr)

    def on_task_request(self, request: Any) -> None:
        self._enforcer.submit(self._consumer, request, self._name)

    def apply_eta_task(self, request: Any) -> None:
        if self._epoch != self._enforcer.connection_epoch:
            # The ETA timer of a message of a lost connection (Celery 5.7 cancels those on
            # close; 5.5 and 5.6 let them fire): the broker delivers it again, so running it
            # here would run it twice. Its connection's prefetch window is gone too.
            logger.debug("celery-extras: %s[%s] of a lost connection dropped", self._name,
                         getattr(request, "id", "?"))  # fmt: skip
            return
        compat.narrow_prefetch(self._consumer)  # the strategy widened it for the ETA wait
        self._enforcer.after_eta(self._consumer, request, self._name)


def limited_strategy(task: Task, app: Celery, consumer: Any, **kwargs: Any) -> Any:
    """Strategy of a task with ``limit()`` and/or ``concurrency()``: its own strategy behind
    a gated consumer (the rate limit first, then the concurrency slot)."""
    original = task.__dict__.get("_extras_strategy") or type(task).Strategy
    enforcer = getattr(consumer, ENFORCER_ATTR, None)
    slots = getattr(consumer, SLOTS_ATTR, None)
    policies = policies_of(task)
    gated: Any = consumer
    if slots is not None and policies is not None and policies.concurrency is not None:
        slots.register(task.name, policies.concurrency)
        gated = SlotConsumer(gated, slots, task.name)
    if enforcer is not None and policies is not None and policies.limit is not None:
        enforcer.register(task.name, policies.limit)
        gated = GatedConsumer(gated, enforcer, task.name)
    if gated is consumer:
        return instantiate(original, task, app, consumer, **kwargs)
    if symbol_by_name(original) is default_strategy:
        kwargs.setdefault("task_reserved", _no_reserve)
    return instantiate(original, task, app, gated, **kwargs)
