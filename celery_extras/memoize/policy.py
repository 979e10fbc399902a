"""Memoize as a policy of the admission pipeline: ``memoize()``, its gate and its setting, in
one entry of ``celery_extras.policies.POLICIES``."""

from __future__ import annotations

from ..keyed.gate import key_run_policy
from .gate import MemoizeGate

__all__ = ["MEMOIZE"]


MEMOIZE = key_run_policy(MemoizeGate, promise="")
