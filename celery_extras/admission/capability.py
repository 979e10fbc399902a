"""The policies (coalescing, limits, concurrency, retries) as ``install(app)`` wires them:
settings, the admission step and its gates, the decorators' hooks."""

from __future__ import annotations

from typing import Any

from celery import Celery, bootsteps
from celery.signals import before_task_publish, task_prerun

from ..batch.gate import BatchGate
from ..capability import Capability
from ..coalesce.gate import CoalesceGate
from ..coalesce.sent import stamp_sent
from ..concurrency.gate import SlotGate
from ..limits.gate import LimitGate
from ..settings import Setting, boolean, choice, number, settings_of
from ..store.client import StoreStep
from .decorators import track_app
from .eager import warn_eager
from .gate import GateFactory
from .pipeline import PIPELINE_ATTR, Pipeline

__all__ = ["GATES", "POLICIES", "AdmissionStep"]


#: The gates every task with a policy passes, in this order: a message first learns
#: whether another run covers it (then it takes no token and no slot), then waits for
#: its rate, then for a concurrency slot (a slot is held only while the task runs), then,
#: admitted, joins its batch (a batch runs as one job once full or due).
GATES: tuple[GateFactory, ...] = (CoalesceGate, LimitGate, SlotGate, BatchGate)


class AdmissionStep(bootsteps.StartStopStep):
    """Consumer step owning the worker's admission :class:`~.pipeline.Pipeline` (its gates:
    :data:`GATES`)."""

    label = "extras-admission"
    requires = ("celery.worker.consumer.connection:Connection", StoreStep)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        settings = settings_of(c.app)
        setattr(c, PIPELINE_ATTR, Pipeline([gate(c.app, settings) for gate in GATES]))

    def start(self, c: Any) -> None:
        pipeline: Pipeline = getattr(c, PIPELINE_ATTR)
        pipeline.gate(LimitGate.label).load_overrides()
        pipeline.start(c)

    def stop(self, c: Any) -> None:
        getattr(c, PIPELINE_ATTR).stop()

    def shutdown(self, c: Any) -> None:
        getattr(c, PIPELINE_ATTR).stop()

    def info(self, c: Any) -> dict[str, Any]:
        pipeline: Pipeline = getattr(c, PIPELINE_ATTR)
        return {
            "extras_policies": {
                **pipeline.gate(LimitGate.label).info(),
                "concurrency": pipeline.gate(SlotGate.label).info(),
                "coalesce": pipeline.gate(CoalesceGate.label).info(),
                "batch": pipeline.gate(BatchGate.label).info(),
            }
        }


def _connect(app: Celery) -> None:
    from ..limits import control  # noqa: F401  (registers the extras_limit control command)

    track_app(app)
    before_task_publish.connect(stamp_sent, weak=False, dispatch_uid="celery_extras.coalesce")
    if app.configured:
        _eager_warnings(app)
    else:
        app.on_after_configure.connect(_eager_warnings, weak=False)


def _eager_warnings(sender: Celery, **_: Any) -> None:
    """Warn of eager calls where they are configured, and only there: a ``task_prerun``
    receiver makes every worker send the signal for every task."""
    if sender.conf.task_always_eager:
        task_prerun.connect(warn_eager, weak=False, dispatch_uid="celery_extras.eager")


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
            "limits_shadow",
            False,
            boolean,
            "bool",
            "Every ``limit()`` in shadow mode, as if declared with ``shadow=True``: evaluated "
            "and counted (``shadow_limited``, and the wait it would have imposed, per limit "
            "in ``inspect stats`` and Prometheus) but never delaying a task. To see what "
            "limits would do to production before they are enforced.",
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
            "coalesce_on_store_error",
            "hold",
            choice("hold", "run"),
            "str",
            "What a ``coalesce()`` task does while the store cannot be reached (or may evict "
            "its holds): ``'hold'`` keeps each message waiting (unacked, never lost, never "
            "two runs of a key at once) and asks the store again every "
            "``extras_limit_store_retry`` seconds; ``'run'`` runs every message without "
            "coalescing (availability first). Logged once per outage.",
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
    consumer_steps=(AdmissionStep,),
    connect=_connect,
)
