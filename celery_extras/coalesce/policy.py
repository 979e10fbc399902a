"""Coalescing as a policy of the admission pipeline: ``coalesce()``, its gate, settings and
the producer's send-time stamp, in one entry of ``celery_extras.policies.POLICIES``."""

from __future__ import annotations

from ..admission.policy import Policy
from ..admission.sent import connect_stamps
from ..settings import Setting, choice
from .gate import CoalesceGate

__all__ = ["COALESCE"]


COALESCE = Policy(
    name="coalesce",
    parks=True,
    decorator="coalesce()",
    gate=CoalesceGate,
    connect=connect_stamps,
    info_key="coalesce",
    settings=(
        Setting(
            "coalesce_on_store_error",
            "hold",
            choice("hold", "run"),
            "str",
            "What a ``coalesce()`` task does while the store cannot be reached (or may evict "
            "its holds): ``'hold'`` keeps each message waiting (unacked, never lost, never "
            "two runs of a key at once) and asks the store again every "
            "``extras_store_retry`` seconds; ``'run'`` runs every message without "
            "coalescing (availability first). Logged once per outage.",
        ),
    ),
)
