"""Debounce as a policy of the admission pipeline: ``debounce()``, its gate and its setting, in
one entry of ``celery_extras.policies.POLICIES``."""

from __future__ import annotations

from ..admission.policy import Policy
from ..admission.sent import connect_stamps
from ..settings import Setting, choice
from .gate import DebounceGate

__all__ = ["DEBOUNCE"]


DEBOUNCE = Policy(
    name="debounce",
    parks=True,
    decorator="debounce()",
    gate=DebounceGate,
    connect=connect_stamps,
    info_key="debounce",
    settings=(
        Setting(
            "debounce_on_store_error",
            "hold",
            choice("hold", "run"),
            "str",
            "What a ``debounce()`` task does while the store cannot be reached (or may evict "
            "its holds): ``'hold'`` keeps each message waiting (unacked, never lost, never "
            "two runs of a key at once) and asks the store again every "
            "``extras_store_retry`` seconds; ``'run'`` runs every message without "
            "debouncing (availability first). Logged once per outage.",
        ),
    ),
)
