"""celery-extras: durable revoke sync, cluster-wide limits and retry policies,
weighted fair queues and time-wheel throughput statistics for Celery.

Add it to an app with one call::

    import celery_extras
    celery_extras.install(app)
"""

from __future__ import annotations

from .admission.spec import PolicyError
from .batch.call import Call
from .batch.decorator import batch
from .capability import Capability
from .coalesce.decorator import coalesce
from .concurrency.decorator import concurrency
from .consumer import FairConsumerMixin, WeightedCycle, WeightedOrder
from .debounce.decorator import debounce
from .delay import DelayStore, RedisDelayStore
from .delay.capability import delayed
from .delay.purge import drop_delayed

# last: ``install`` wires every capability above (imported first, so the module
# ``celery_extras.install`` is bound to this name as the function, not the module)
from .install import CAPABILITIES, install
from .limits.decorator import limit
from .limits.rate import parse_rate
from .limits.token_bucket import TokenBucket
from .memoize.decorator import memoize
from .memoize.invalidate import invalidate
from .retries.decorator import retry_policy
from .retries.failure_memory import Counts, MemoryCounts
from .retries.hook import retry_memory
from .retries.policies import (
    BucketPolicy,
    ExponentialBackoff,
    FastSlow,
    Jitter,
    MaxOf,
    RetryPolicy,
    WithMaxWait,
)
from .settings import ExtrasSettings, Setting, settings_of
from .stats import Histogram, TimeWheel
from .sync import DurableRevokes, RevokeStore, cluster_revoked, record_revokes
from .testing.clock import SimulatedClock

__all__ = [
    "CAPABILITIES",
    "BucketPolicy",
    "Call",
    "Capability",
    "Counts",
    "DelayStore",
    "DurableRevokes",
    "ExponentialBackoff",
    "ExtrasSettings",
    "FairConsumerMixin",
    "FastSlow",
    "Histogram",
    "Jitter",
    "MaxOf",
    "MemoryCounts",
    "PolicyError",
    "RedisDelayStore",
    "RetryPolicy",
    "RevokeStore",
    "Setting",
    "SimulatedClock",
    "TimeWheel",
    "TokenBucket",
    "WeightedCycle",
    "WeightedOrder",
    "WithMaxWait",
    "batch",
    "cluster_revoked",
    "coalesce",
    "concurrency",
    "debounce",
    "delayed",
    "drop_delayed",
    "install",
    "invalidate",
    "limit",
    "memoize",
    "parse_rate",
    "record_revokes",
    "retry_memory",
    "retry_policy",
    "settings_of",
]
