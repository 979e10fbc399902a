"""Lamport clock and revoked-set sync between workers, durable across restarts."""

from .client import DurableRevokes, record_revokes
from .control import cluster_revoked
from .digest import Pull, Version, plan_pull
from .revoke_store import RevokeStore

__all__ = [
    "DurableRevokes",
    "Pull",
    "RevokeStore",
    "Version",
    "cluster_revoked",
    "plan_pull",
    "record_revokes",
]
