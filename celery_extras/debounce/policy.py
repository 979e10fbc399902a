"""Debounce as a policy of the admission pipeline: ``debounce()``, its gate and its setting, in
one entry of ``celery_extras.policies.POLICIES``."""

from __future__ import annotations

from ..admission.sent import connect_stamps
from ..keyed.gate import key_run_policy
from .gate import DebounceGate

__all__ = ["DEBOUNCE"]


DEBOUNCE = key_run_policy(DebounceGate, parks=True, connect=connect_stamps)
