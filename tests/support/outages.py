"""The store-outage lines of a worker's log: one per process and outage, naming every user
of the store and what the outage means for it (``celery_extras/store/health.py``)."""

from __future__ import annotations

__all__ = ["store_outages", "store_recoveries"]


def store_outages(log: str, user: str = "") -> list[str]:
    """The lines that say the store could not be reached (and name *user*, if given)."""
    return [line for line in log.splitlines()
            if "celery-extras: the store failed (" in line and f"{user}: " in line]  # fmt: skip


def store_recoveries(log: str) -> list[str]:
    """The lines that say the store answers again after an outage."""
    return [line for line in log.splitlines() if "celery-extras: the store answers again" in line]
