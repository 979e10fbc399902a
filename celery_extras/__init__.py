"""celery-extras: durable revoke sync, cluster-wide limits and retry policies,
weighted fair queues and time-wheel throughput statistics for Celery.

Add it to an app with one call::

    import celery_extras
    celery_extras.install(app)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .capability import Capability
from .consumer import FairConsumerMixin, WeightedCycle, WeightedOrder
from .delay import DelayStore, RedisDelayStore
from .delay.capability import delayed
from .policies import (
    BucketPolicy,
    ExponentialBackoff,
    FastSlow,
    Jitter,
    MaxOf,
    PolicyError,
    RetryPolicy,
    WithMaxWait,
    concurrency,
    limit,
    retry_policy,
)
from .settings import ExtrasSettings, Setting, settings_of
from .stats import Histogram, TimeWheel
from .sync import DurableRevokes, RevokeStore, cluster_revoked, record_revokes

__all__ = [
    "CAPABILITIES",
    "BucketPolicy",
    "Capability",
    "DelayStore",
    "DurableRevokes",
    "ExponentialBackoff",
    "ExtrasSettings",
    "FairConsumerMixin",
    "FastSlow",
    "Histogram",
    "Jitter",
    "MaxOf",
    "PolicyError",
    "RedisDelayStore",
    "RetryPolicy",
    "RevokeStore",
    "Setting",
    "TimeWheel",
    "WeightedCycle",
    "WeightedOrder",
    "WithMaxWait",
    "cluster_revoked",
    "concurrency",
    "delayed",
    "install",
    "limit",
    "record_revokes",
    "retry_policy",
    "settings_of",
]

if TYPE_CHECKING:
    from .install import CAPABILITIES, install
else:

    def __getattr__(name: str) -> Any:
        """``install`` and ``CAPABILITIES``, imported on first use.

        ``celery_extras.install`` imports every capability; a module of one capability
        (``celery_extras.policies.enforce``) imports without it, so no import circle.
        """
        if name not in ("install", "CAPABILITIES"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        module = importlib.import_module(".install", __name__)
        globals().update(install=module.install, CAPABILITIES=module.CAPABILITIES)
        return globals()[name]
