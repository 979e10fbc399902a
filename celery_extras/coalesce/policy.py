"""Coalescing as a policy of the admission pipeline: ``coalesce()``, its gate, settings and
the producer's send-time stamp, in one entry of ``celery_extras.policies.POLICIES``."""

from __future__ import annotations

from ..admission.sent import connect_stamps
from ..keyed.gate import key_run_policy
from .gate import CoalesceGate

__all__ = ["COALESCE"]


COALESCE = key_run_policy(CoalesceGate, parks=True, connect=connect_stamps)
