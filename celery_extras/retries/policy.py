"""Retry policies as a policy: ``retry_policy()`` acts in the pool (its ``run`` wrapper), not
in the admission pipeline; one entry of ``celery_extras.policies.POLICIES``."""

from __future__ import annotations

from ..admission.policy import Policy
from ..settings import Setting, number
from .hook import install_retry

__all__ = ["RETRIES"]

RETRIES = Policy(
    name="retry",
    parks=True,
    decorator="retry_policy()",
    apply=install_retry,
    settings=(
        Setting(
            "retry_memory_ttl",
            86400.0,
            number(above=0),
            "float",
            "Seconds a per-item failure count of a retry policy is kept after its last "
            "failure (success forgets it at once).",
        ),
    ),
)
