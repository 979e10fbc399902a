"""The policies of celery-extras, in the order the admission pipeline asks their gates.

A message first learns whether another run covers it (a result memoize keeps, coalescing,
debounce: then it takes no token and no slot), then waits for its rate, then for a
concurrency slot (held only while the task runs), then, admitted, joins its batch. Retry
policies act in the pool.

One line per policy, naming its entry (a :class:`~.admission.policy.Policy`) in its own
folder, as Celery names its bootsteps: adding a policy is its folder and one line here.
"""

from __future__ import annotations

from celery.utils.imports import symbol_by_name

from .admission.policy import Policy

__all__ = ["ENTRIES", "POLICIES"]

ENTRIES: tuple[str, ...] = (
    "celery_extras.memoize.policy:MEMOIZE",
    "celery_extras.coalesce.policy:COALESCE",
    "celery_extras.debounce.policy:DEBOUNCE",
    "celery_extras.limits.policy:LIMITS",
    "celery_extras.concurrency.policy:CONCURRENCY",
    "celery_extras.concurrency.queue_policy:QUEUE_CONCURRENCY",
    "celery_extras.batch.policy:BATCH",
    "celery_extras.retries.policy:RETRIES",
)


def _entry(name: str) -> Policy:
    policy = symbol_by_name(name)
    if not isinstance(policy, Policy):
        raise TypeError(f"{name} is not a celery_extras Policy: {policy!r}")
    return policy


POLICIES: tuple[Policy, ...] = tuple(_entry(name) for name in ENTRIES)
