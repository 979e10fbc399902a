"""The admission pipeline as ``install(app)`` wires it, from the list of policies it is given:
their settings, the admission step with their gates, the decorators' hooks, what each
policy connects. This package imports no policy (``celery_extras.policies`` lists them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery, bootsteps
from celery.signals import task_prerun

from ..capability import Capability
from ..delay.gate import DELAY_ATTR
from ..settings import settings_of
from ..store.client import StoreStep
from .decorators import track_app
from .eager import warn_eager
from .pipeline import PIPELINE_ATTR, Pipeline
from .policy import Policy, registered, use

__all__ = ["AdmissionStep", "admission_capability"]


class AdmissionStep(bootsteps.StartStopStep):
    """Consumer step owning the worker's admission :class:`~.pipeline.Pipeline`: the gates
    of the registered policies, in their order."""

    label = "extras-admission"
    requires = ("celery.worker.consumer.connection:Connection", StoreStep)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        settings = settings_of(c.app)
        gates = [p.gate(c.app, settings) for p in registered() if p.gate is not None]
        setattr(c, PIPELINE_ATTR, Pipeline(gates))

    def start(self, c: Any) -> None:
        getattr(c, PIPELINE_ATTR).start(c, getattr(c, DELAY_ATTR, None))

    def stop(self, c: Any) -> None:
        getattr(c, PIPELINE_ATTR).stop()

    def shutdown(self, c: Any) -> None:
        getattr(c, PIPELINE_ATTR).stop()

    def info(self, c: Any) -> dict[str, Any]:
        pipeline: Pipeline = getattr(c, PIPELINE_ATTR)
        figures: dict[str, Any] = {}
        for policy, gate in zip(
            [p for p in registered() if p.gate is not None], pipeline.gates, strict=True
        ):
            if policy.info_key:
                figures[policy.info_key] = gate.info()
            else:
                figures.update(gate.info())
        return {"extras_policies": figures, "extras_store_line": pipeline.rounds.info()}


def _eager_warnings(sender: Celery, **_: Any) -> None:
    """Warn of eager calls where they are configured, and only there: a ``task_prerun``
    receiver makes every worker send the signal for every task."""
    if sender.conf.task_always_eager:
        task_prerun.connect(warn_eager, weak=False, dispatch_uid="celery_extras.eager")


def admission_capability(policies: Sequence[Policy]) -> Capability:
    """The capability of *policies* (in the pipeline's order): what ``install`` adds."""
    use(policies)

    def connect(app: Celery) -> None:
        track_app(app)
        for policy in policies:
            if policy.connect is not None:
                policy.connect(app)
        if app.configured:
            _eager_warnings(app)
        else:
            app.on_after_configure.connect(_eager_warnings, weak=False)

    return Capability(
        name="policies",
        settings=tuple(s for p in policies for s in p.settings),
        consumer_steps=(AdmissionStep,),
        connect=connect,
    )
