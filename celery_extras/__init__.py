"""celery-extras: durable revoke sync, cluster-wide limits and retry policies,
weighted fair queues and time-wheel throughput statistics for Celery.

Add it to an app with one call::

    import celery_extras
    celery_extras.install(app)
"""

from .capability import Capability
from .consumer import FairConsumerMixin, WeightedCycle, WeightedOrder
from .install import CAPABILITIES, install, settings_of
from .policies import (
    BucketPolicy,
    ExponentialBackoff,
    FastSlow,
    Jitter,
    MaxOf,
    PolicyError,
    RetryPolicy,
    WithMaxWait,
    limit,
    retry_policy,
)
from .settings import Setting
from .stats import Histogram, TimeWheel
from .sync import DurableRevokes, RevokeStore, cluster_revoked, record_revokes

__all__ = [
    "CAPABILITIES",
    "BucketPolicy",
    "Capability",
    "DurableRevokes",
    "ExponentialBackoff",
    "FairConsumerMixin",
    "FastSlow",
    "Histogram",
    "Jitter",
    "MaxOf",
    "PolicyError",
    "RetryPolicy",
    "RevokeStore",
    "Setting",
    "TimeWheel",
    "WeightedCycle",
    "WeightedOrder",
    "WithMaxWait",
    "cluster_revoked",
    "install",
    "limit",
    "record_revokes",
    "retry_policy",
    "settings_of",
]
