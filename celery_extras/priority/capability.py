"""The priority capability as ``install(app)`` wires it: its settings, its worker step and
the Redis transport's ten levels."""

from __future__ import annotations

from ..capability import Capability
from ..settings import Setting, boolean, number, optional
from .fair import PriorityQueueBuffers
from .step import PriorityStep
from .transport import connect_priority

__all__ = ["PRIORITY"]

PRIORITY = Capability(
    name="priority",
    settings=(
        Setting(
            "priority",
            False,
            boolean,
            "bool",
            "Priorities that mean what they say: on Redis ten distinct levels 0-9 (0 first, "
            "FIFO within a level); in the worker, the request that goes to a free pool "
            "process is the best waiting then, not the first fetched (Redis, and RabbitMQ "
            "queues with ``x-max-priority``). Set it on every app that publishes or consumes.",
        ),
        Setting(
            "priority_aging",
            None,
            optional(number(above=0)),
            "float | None",
            "Seconds after which a request waiting in a worker for a pool process ranks one "
            "level better (again every as many seconds): no level starves. ``None``: strict "
            "levels.",
        ),
        Setting(
            "priority_prefetch",
            100,
            optional(number(minimum=0, integer=True)),
            "int | None",
            "Requests waiting for a pool process that do not count against the prefetch "
            "window, so that a better message sent behind a backlog is fetched while the "
            "pool is busy (beyond it, a better message waits for one more task to start). "
            "``None``: no bound (the worker takes in the whole backlog).",
        ),
    ),
    worker_steps=(PriorityStep,),
    consumer_steps=(PriorityQueueBuffers,),
    connect=connect_priority,
)
