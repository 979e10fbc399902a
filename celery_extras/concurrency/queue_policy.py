"""Per-queue concurrency as an entry of the admission pipeline's list: its gate and its
setting, ``extras_queue_concurrency`` (no decorator: the setting names the queues)."""

from __future__ import annotations

from ..admission.policy import Policy
from ..settings import Setting
from .queue_gate import QueueSlotGate, check_setting, connect

__all__ = ["QUEUE_CONCURRENCY"]

QUEUE_CONCURRENCY = Policy(
    name="queue_concurrency",
    decorator="extras_queue_concurrency",
    gate=QueueSlotGate,
    info_key="queue_concurrency",
    connect=connect,
    settings=(
        Setting(
            "queue_concurrency",
            {},
            check_setting,
            "dict",
            "Per-queue caps: ``{'slow': 1}`` runs at most 1 task of queue ``slow`` at once in "
            "each worker, whatever the task; ``{'slow': {'limit': 10, 'scope': 'global'}}`` "
            "at most 10 across the cluster, on ``concurrency()``'s leased slots (``'lease'``: "
            "seconds, default 30). A task waiting for its queue's slot holds no pool process "
            "and does not clog the prefetch window (:doc:`/queues`).",
        ),
    ),
)
