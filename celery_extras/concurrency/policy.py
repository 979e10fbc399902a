"""Concurrency limits as a policy of the admission pipeline: ``concurrency()``, its gate and
settings, in one entry of ``celery_extras.policies.POLICIES``."""

from __future__ import annotations

from ..admission.policy import Policy
from ..settings import Setting, choice
from .gate import SlotGate

__all__ = ["CONCURRENCY"]

CONCURRENCY = Policy(
    name="concurrency",
    decorator="concurrency()",
    gate=SlotGate,
    info_key="concurrency",
    settings=(
        Setting(
            "concurrency_on_store_error",
            "local",
            choice("local", "allow", "delay"),
            "str",
            "What a global ``concurrency()`` does while its Redis store cannot be reached: "
            "``'local'`` applies the same cap per worker, ``'allow'`` runs tasks without a cap, "
            "``'delay'`` keeps each task waiting (unacked, never lost, no pool slot) and asks "
            "the store again every ``extras_store_retry`` seconds. Logged once per outage.",
        ),
    ),
)
