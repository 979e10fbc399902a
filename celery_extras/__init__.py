"""celery-extras: durable revoke sync, cluster-wide limits and retry policies,
weighted fair queues and time-wheel throughput statistics for Celery.

Add it to an app with one call::

    import celery_extras
    celery_extras.install(app)
"""

from .capability import Capability
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

__all__ = [
    "CAPABILITIES",
    "BucketPolicy",
    "Capability",
    "ExponentialBackoff",
    "FastSlow",
    "Histogram",
    "Jitter",
    "MaxOf",
    "PolicyError",
    "RetryPolicy",
    "Setting",
    "TimeWheel",
    "WithMaxWait",
    "install",
    "limit",
    "retry_policy",
    "settings_of",
]
