"""``celery extras concurrency TASK N``: change a concurrency cap at run time, cluster-wide.

The new cap is written to the store's ``<prefix>:concurrency`` hash, which every
worker reads at most every second, for global and worker-scope slots alike.
"""

from __future__ import annotations

from celery import Celery

from ..checks import is_int
from ..store.client import redis_client, store_key
from .redis_slots import RedisSlots
from .spec import MAX_CONCURRENCY

__all__ = ["set_concurrency"]


def set_concurrency(app: Celery, task_name: str, n: int | None) -> None:
    """Store the cap of *task_name* (``None``: back to the task's own ``concurrency(n)``).

    Raises :class:`ValueError` for a bad *n* before anything is changed.
    """
    if not isinstance(task_name, str) or not task_name:
        raise ValueError(f"task name {task_name!r}: expected a task name")
    if n is not None and not is_int(n, minimum=1, maximum=MAX_CONCURRENCY):
        raise ValueError(f"n {n!r}: expected an int from 1 to {MAX_CONCURRENCY}")
    RedisSlots(redis_client(app), store_key(app)).set_cap(task_name, n)
