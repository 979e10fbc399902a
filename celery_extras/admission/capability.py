"""The policies capability as ``install(app)`` wires it: settings, bootsteps, hooks."""

from __future__ import annotations

from typing import Any

from celery import Celery, bootsteps

from ..capability import Capability
from ..concurrency.gate import SLOTS_ATTR, SlotGate
from ..limits.gate import ENFORCER_ATTR, Enforcer
from ..settings import Setting, choice, number, settings_of
from ..store import StoreStep
from .decorators import track_app

__all__ = ["POLICIES", "PoliciesStep"]


class PoliciesStep(bootsteps.StartStopStep):
    """Consumer step owning the worker's :class:`~.enforce.Enforcer` (limits before the pool)
    and :class:`~.concurrency.SlotGate` (concurrency slots, after the limits)."""

    label = "extras-policies"
    requires = ("celery.worker.consumer.connection:Connection", StoreStep)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        setattr(c, ENFORCER_ATTR, Enforcer(c.app, settings_of(c.app)))
        setattr(c, SLOTS_ATTR, SlotGate(c.app, settings_of(c.app)))

    def start(self, c: Any) -> None:
        enforcer: Enforcer = getattr(c, ENFORCER_ATTR)
        enforcer.load_overrides()
        enforcer.announce(*enforcer.overrides)
        getattr(c, SLOTS_ATTR).start(c)

    def stop(self, c: Any) -> None:
        getattr(c, ENFORCER_ATTR).stop()
        getattr(c, SLOTS_ATTR).stop()

    def shutdown(self, c: Any) -> None:
        getattr(c, ENFORCER_ATTR).stop()
        getattr(c, SLOTS_ATTR).stop()

    def info(self, c: Any) -> dict[str, Any]:
        return {
            "extras_policies": {
                **getattr(c, ENFORCER_ATTR).info(),
                "concurrency": getattr(c, SLOTS_ATTR).info(),
            }
        }


def _connect(app: Celery) -> None:
    from ..limits import control  # noqa: F401  (registers the extras_limit control command)

    track_app(app)


POLICIES = Capability(
    name="policies",
    settings=(
        Setting(
            "limit_max_hold",
            2.0,
            number(minimum=0),
            "float",
            "Longest wait (seconds) a rate-limited task is held in the worker (no pool slot, "
            "prefetch window widened). A longer wait parks the message in the delay store "
            "with its booked slot (stored, then the original acked); so does a retry whose "
            "countdown is longer.",
        ),
        Setting(
            "limit_on_store_error",
            "local",
            choice("local", "allow", "delay"),
            "str",
            "What a global limit does while its Redis store cannot be reached: ``'local'`` "
            "applies the same rate per worker, ``'allow'`` runs tasks unlimited, ``'delay'`` "
            "keeps each task waiting (unacked, never lost) and asks the store again every "
            "``extras_limit_store_retry`` seconds. Logged once per outage.",
        ),
        Setting(
            "concurrency_on_store_error",
            "local",
            choice("local", "allow", "delay"),
            "str",
            "What a global ``concurrency()`` does while its Redis store cannot be reached: "
            "``'local'`` applies the same cap per worker, ``'allow'`` runs tasks without a cap, "
            "``'delay'`` keeps each task waiting (unacked, never lost, no pool slot) and asks "
            "the store again every ``extras_limit_store_retry`` seconds. Logged once per outage.",
        ),
        Setting(
            "limit_store_retry",
            1.0,
            number(above=0),
            "float",
            "Seconds between attempts to reach the store after it failed (the store is not "
            "asked in between, so an outage does not slow every task by a timeout).",
        ),
        Setting(
            "retry_memory_ttl",
            86400.0,
            number(above=0),
            "float",
            "Seconds a per-item failure count of a retry policy is kept after its last "
            "failure (success forgets it at once).",
        ),
    ),
    consumer_steps=(PoliciesStep,),
    connect=_connect,
)
