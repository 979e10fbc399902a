"""The consumer capability as ``install(app)`` wires it: settings and the fair-queues step."""

from __future__ import annotations

from typing import Any

from ..bounds import shown
from ..capability import Capability
from ..checks import is_int
from ..settings import Setting, number, optional, reject
from .step import FairQueues

__all__ = ["CONSUMER"]


def queue_weights(key: str, value: Any) -> dict[str, int]:
    """A non-empty ``{queue name: integer weight >= 1}``."""
    if not isinstance(value, dict) or not value:
        raise reject(key, "a non-empty dict of queue name to integer weight >= 1", value)
    for name, weight in value.items():
        if not isinstance(name, str) or not name:
            raise reject(key, "queue names as non-empty strings", name)
        if not is_int(weight, minimum=1):
            raise reject(f"{key}[{shown(name)}]", "an integer weight >= 1", weight)
    return dict(value)


CONSUMER = Capability(
    name="consumer",
    settings=(
        Setting(
            "queue_weights",
            None,
            optional(queue_weights),
            "dict[str, int] | None",
            'Weights of the worker\'s queues, e.g. ``{"high": 4, "low": 1}``: turns on '
            "weighted fair consumption (a queue not named has weight 1). ``None``: Celery's "
            "own task consumer.",
        ),
        Setting(
            "queue_prefetch",
            None,
            optional(number(minimum=1, integer=True)),
            "int | None",
            "Unacked messages each queue may hold in the worker when weights are on. ``None``: "
            "the worker's prefetch count (concurrency x ``worker_prefetch_multiplier``).",
        ),
    ),
    consumer_steps=(FairQueues,),
)
