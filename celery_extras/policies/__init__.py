"""Per-task token-bucket limits and client-go style retry policies."""

from .counts import Counts, MemoryCounts
from .decorators import concurrency, limit, retry_policy
from .rate import parse_rate
from .retry import retry_memory
from .retry_limiters import (
    BucketPolicy,
    ExponentialBackoff,
    FastSlow,
    Jitter,
    MaxOf,
    RetryPolicy,
    WithMaxWait,
)
from .spec import PolicyError
from .token_bucket import TokenBucket

__all__ = [
    "BucketPolicy",
    "Counts",
    "ExponentialBackoff",
    "FastSlow",
    "Jitter",
    "MaxOf",
    "MemoryCounts",
    "PolicyError",
    "RetryPolicy",
    "TokenBucket",
    "WithMaxWait",
    "concurrency",
    "limit",
    "parse_rate",
    "retry_memory",
    "retry_policy",
]
