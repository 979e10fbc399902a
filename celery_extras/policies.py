"""The policies of celery-extras, in the order the admission pipeline asks their gates.

A message first learns whether another run covers it (coalescing: then it takes no token
and no slot), then waits for its rate, then for a concurrency slot (held only while the
task runs), then, admitted, joins its batch. Retry policies act in the pool. One line per
policy: its entry lives in its own folder.
"""

from __future__ import annotations

from .admission.policy import Policy
from .batch.policy import BATCH
from .coalesce.policy import COALESCE
from .concurrency.policy import CONCURRENCY
from .limits.policy import LIMITS
from .retries.policy import RETRIES

__all__ = ["POLICIES"]

POLICIES: tuple[Policy, ...] = (
    COALESCE,
    LIMITS,
    CONCURRENCY,
    BATCH,
    RETRIES,
)
