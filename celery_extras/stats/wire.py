"""What a value in a ``worker-throughput`` event may be: size bounds and their predicates.

Pure, no Celery import. :mod:`.schema` checks the event's figures with them and
:mod:`.gauges` the worker's gauges (``extras_state``), so both refuse the same
hostile sizes; a payload beyond them costs a check, not memory.
"""

from __future__ import annotations

from typing import Any

from ..checks import is_int

__all__ = ["MAX_NAME", "MAX_QUEUES", "MAX_TASKS", "MAX_WINDOWS", "count", "short"]

#: Windows an event may list.
MAX_WINDOWS = 16
#: Task names an event may list (in ``tasks``, or per task in a gauge).
MAX_TASKS = 10_000
#: Characters of a name: a hostname, a task, a queue, a capability, a policy.
MAX_NAME = 500
#: Queues a gauge may list.
MAX_QUEUES = 1000


def count(value: Any) -> bool:
    """*value* is an integer ``>= 0`` (not a bool)."""
    return is_int(value, minimum=0)


def short(value: Any) -> bool:
    """*value* is a non-empty string of at most :data:`MAX_NAME` characters."""
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME
