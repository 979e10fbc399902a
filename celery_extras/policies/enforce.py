"""Limits enforced in the worker's main process, before a task reaches the pool.

A limited task's strategy is Celery's own (or the task's), given a consumer
whose ``on_task_request`` and ``apply_eta_task`` pass through the
:class:`Enforcer` first. Each arriving task books a slot in its bucket (global
on Redis, or local) and then:

* runs now when the slot is now;
* is *held* in the worker's timer when the wait is at most ``extras_limit_max_hold``:
  it takes no pool slot, and the prefetch window is widened while it waits (as
  Celery does for ETA tasks) so other tasks keep flowing;
* is *handed back* to the broker otherwise: the same message is published again
  with the ETA of its slot and a header saying the slot is booked, and only then
  is the original acked.

Held messages stay unacked, so a worker killed while holding them loses none:
the broker delivers them again. Waits are reported with
:data:`celery_extras.signals.task_rate_limited`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from celery import Celery, Task
from celery.utils.imports import instantiate, symbol_by_name
from celery.utils.time import maybe_iso8601
from celery.worker import state as worker_state
from celery.worker.strategy import default as default_strategy

from ..signals import task_rate_limited
from ..store import StoreUnavailable, redis_client, store_key
from .global_bucket import GlobalBucket, Override
from .rate import format_rate, parse_rate
from .registry import policies_of
from .spec import LimitSpec
from .token_bucket import TokenBucket

__all__ = ["ENFORCER_ATTR", "SLOT_HEADER", "Enforcer", "GatedConsumer", "limited_strategy"]

logger = logging.getLogger(__name__)

#: Attribute of the consumer holding its :class:`Enforcer`.
ENFORCER_ATTR = "extras_policies"
#: Header of a message handed back with its slot already booked (value: the bucket name).
SLOT_HEADER = "extras_slot"

#: How late a booked slot may still be used: half the bucket's interval, so that no second
#: sees more than rate + burst runs, but at least :data:`LATE_FLOOR` (timer jitter must not
#: send every task of a fast bucket round again) and at most :data:`LATE_CAP` seconds.
#: A slot missed by more (the worker or the broker was away) is booked again: tasks
#: delayed by an outage must not all run at once when it ends.
LATE_FLOOR = 0.02
LATE_CAP = 0.5

_STORE_ERRORS = (redis.RedisError, StoreUnavailable, OSError)
_MAX_LOCAL_BUCKETS = 4096


def _no_reserve(request: Any) -> None:
    """Stand-in for ``task_reserved`` in the strategy: the enforcer reserves at go time."""


class Enforcer:
    """Per-worker state of the limits: buckets, held tasks, run-time rates, store health."""

    def __init__(
        self, app: Celery, settings: dict[str, Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.app = app
        self.clock = clock
        self.max_hold: float = settings["limit_max_hold"]
        self.on_store_error: str = settings["limit_on_store_error"]
        self.store_retry: float = settings["limit_store_retry"]
        self.specs: dict[str, LimitSpec] = {}
        self.overrides: dict[str, Override] = {}
        self.local: dict[tuple[str, str], TokenBucket] = {}
        self.held: dict[int, tuple[Any, Any]] = {}
        self.counts = {"admitted": 0, "held": 0, "republished": 0, "store_errors": 0}
        self._bucket: GlobalBucket | None = None
        self._down = False
        self._down_until = 0.0

    # -- set-up --------------------------------------------------------------------------

    def register(self, name: str, spec: LimitSpec) -> None:
        self.specs[name] = spec

    def global_bucket(self) -> GlobalBucket:
        if self._bucket is None:
            self._bucket = GlobalBucket(redis_client(self.app), store_key(self.app))
        return self._bucket

    def load_overrides(self) -> None:
        """Read the run-time rates stored by ``celery extras limit`` (bad entries are logged)."""
        try:
            stored = self.global_bucket().overrides()
        except _STORE_ERRORS as exc:
            logger.warning("celery-extras: could not read run-time limits from the store: %r", exc)
            return
        for name, raw in stored.items():
            try:
                self.overrides[name] = Override.loads(raw)
            except ValueError as exc:
                logger.error("celery-extras: ignoring run-time limit of %s: %s", name, exc)
        for name in self.overrides:
            self._retune(name)

    def stop(self) -> None:
        """Drop held tasks (connection lost or shutting down): the broker delivers them again."""
        for request, entry in list(self.held.values()):
            entry.cancel()
            worker_state.scheduled_requests.discard(request)
            worker_state.requests.pop(request.id, None)
        self.held.clear()

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
            raise ValueError(f"task_name {name!r}: expected a task name (a string)")
        spec = self.specs.get(name)
        if spec is None:
            raise ValueError(f"task {name!r} has no limit() on this worker")
        per_second = parse_rate(rate)
        if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int)
                                  or burst < 1):  # fmt: skip
            raise ValueError(f"burst {burst!r}: expected an integer >= 1")
        text = rate if isinstance(rate, str) else format_rate(per_second)
        self.overrides[name] = Override(per_second, burst, text)
        self._retune(name)
        return f"{name}: {text} (burst {burst or spec.burst}, {spec.scope})"

    # -- deciding ----------------------------------------------------------------------------

    def key_of(self, name: str, spec: LimitSpec, request: Any) -> str:
        if spec.key is None:
            return ""
        try:
            return str(spec.key(request.args, request.kwargs))
        except Exception:
            logger.exception("celery-extras: limit key of %s failed; using its shared bucket", name)
            return ""

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
            return self._local(name, key, rate, burst).reserve(), True
        if self.clock() >= self._down_until:
            try:
                wait = self.global_bucket().reserve(name, spec.rate, spec.burst, key)
            except _STORE_ERRORS as exc:
                self._store_failed(exc)
            else:
                if self._down:
                    self._down = False
                    logger.warning("celery-extras: the store answers again; global limits apply")
                return wait, True
        if self.on_store_error == "local":
            return self._local(f"fallback:{name}", key, rate, burst).reserve(), True
        if self.on_store_error == "allow":
            return 0.0, True
        return self.store_retry, False  # "delay": wait, then ask the store again

    def _store_failed(self, exc: BaseException) -> None:
        self.counts["store_errors"] += 1
        self._down_until = self.clock() + self.store_retry
        if not self._down:
            self._down = True
            logger.error(
                "celery-extras: the store is unreachable (%r); global limits fall back to "
                "extras_limit_on_store_error=%r until it answers (logged once per outage)",
                exc, self.on_store_error,
            )  # fmt: skip

    # -- acting ------------------------------------------------------------------------------

    def submit(self, consumer: Any, request: Any, name: str) -> None:
        """A task of *name* arrived (or its ETA passed): run, hold, or hand it back."""
        spec = self.specs[name]
        wait, booked = self.wait_for(name, spec, request)
        if wait <= 0:
            self.go(consumer, request)
            return
        task_rate_limited.send(sender=name, request=request, wait=wait)
        if wait > self.max_hold and booked and self.republish(request, name, wait):
            return
        self.hold(consumer, request, name, wait, booked)

    def after_eta(self, consumer: Any, request: Any, name: str) -> None:
        """The ETA of a task passed: a handed-back task has its slot (unless it missed it),
        others book one now."""
        if request.request_dict.get(SLOT_HEADER) == name and self._on_time(name, request.eta):
            self.go(consumer, request)
        else:
            self.submit(consumer, request, name)

    def late_tolerance(self, name: str) -> float:
        """Seconds a booked slot of *name* may be used late (see :data:`LATE_FLOOR`)."""
        rate, _burst = self.effective(name, self.specs[name])
        return min(LATE_CAP, max(LATE_FLOOR, 0.5 / rate))

    def _on_time(self, name: str, eta: Any) -> bool:
        try:
            when = maybe_iso8601(eta)
        except (TypeError, ValueError):
            return False
        if not isinstance(when, datetime):
            return False
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        late: float = (datetime.now(UTC) - when).total_seconds()
        return late <= self.late_tolerance(name)

    def go(self, consumer: Any, request: Any) -> None:
        self.counts["admitted"] += 1
        worker_state.task_reserved(request)
        consumer.on_task_request(request)

    def hold(self, consumer: Any, request: Any, name: str, wait: float, booked: bool) -> None:
        self.counts["held"] += 1
        consumer.qos.increment_eventually()  # keep the prefetch window open while it waits
        due = self.clock() + wait
        entry = consumer.timer.call_after(
            wait, self._release, (consumer, request, name, booked, due), priority=6
        )
        self.held[id(request)] = (request, entry)
        request._eta_timer_entry = entry  # so Celery's on_close() cancels it too
        worker_state.task_scheduled(request)

    def _release(self, consumer: Any, request: Any, name: str, booked: bool, due: float) -> None:
        if self.held.pop(id(request), None) is None:
            return  # dropped by stop()
        consumer.qos.decrement_eventually()
        if booked and self.clock() - due <= self.late_tolerance(name):
            self.go(consumer, request)
        else:
            self.submit(consumer, request, name)

    def republish(self, request: Any, name: str, wait: float) -> bool:
        """Publish *request*'s message again with its slot as ETA, then ack the original.

        ``False`` (and nothing acked) when the message cannot be re-published; the
        caller then holds it instead.
        """
        message = request.message
        headers = dict(message.headers or {})
        if "task" not in headers or "id" not in headers:
            return False  # protocol 1 message: hold it instead
        eta = datetime.now(UTC) + timedelta(seconds=wait)
        headers["eta"] = eta.isoformat()
        headers[SLOT_HEADER] = name
        info = message.delivery_info or {}
        props = message.properties or {}
        try:
            with self.app.producer_or_acquire() as producer:
                producer.publish(
                    message.body,
                    exchange=info.get("exchange") or "",
                    routing_key=info.get("routing_key"),
                    headers=headers,
                    content_type=message.content_type,
                    content_encoding=message.content_encoding,
                    correlation_id=props.get("correlation_id"),
                    reply_to=props.get("reply_to"),
                    priority=props.get("priority"),
                    delivery_mode=props.get("delivery_mode"),
                    retry=True,
                    retry_policy={"max_retries": 3, "interval_start": 0.1},
                )
        except Exception as exc:
            logger.warning(
                "celery-extras: could not hand %s[%s] back to the broker (%r); holding it",
                name, request.id, exc,
            )  # fmt: skip
            return False
        self.counts["republished"] += 1
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
            "on_store_error": self.on_store_error,
            "max_hold": self.max_hold,
        }


class GatedConsumer:
    """The consumer as a limited task's strategy sees it: requests go through the enforcer."""

    def __init__(self, consumer: Any, enforcer: Enforcer, name: str) -> None:
        self._consumer = consumer
        self._enforcer = enforcer
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._consumer, attr)

    def on_task_request(self, request: Any) -> None:
        self._enforcer.submit(self._consumer, request, self._name)

    def apply_eta_task(self, request: Any) -> None:
        self._consumer.qos.decrement_eventually()  # the strategy widened it for the ETA wait
        self._enforcer.after_eta(self._consumer, request, self._name)


def limited_strategy(task: Task, app: Celery, consumer: Any, **kwargs: Any) -> Any:
    """Strategy of a task with ``limit()``: its own strategy behind a gated consumer."""
    original = task.__dict__.get("_extras_strategy") or type(task).Strategy
    enforcer = getattr(consumer, ENFORCER_ATTR, None)
    policies = policies_of(task)
    if enforcer is None or policies is None or policies.limit is None:
        return instantiate(original, task, app, consumer, **kwargs)
    enforcer.register(task.name, policies.limit)
    if symbol_by_name(original) is default_strategy:
        kwargs.setdefault("task_reserved", _no_reserve)
    return instantiate(original, task, app, GatedConsumer(consumer, enforcer, task.name), **kwargs)
