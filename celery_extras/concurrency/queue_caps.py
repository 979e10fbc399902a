"""``extras_queue_concurrency``: per-queue caps, read and checked (no Celery import).

``{"slow": 1, "reports": 2}`` caps how many tasks of each queue run at once in one worker;
``{"slow": {"limit": 10, "scope": "global"}}`` across the cluster, on the leased slots of
``concurrency()`` (``"lease"``: seconds, as ``concurrency(lease=...)``). A bad value is an
error naming the setting and the queue.
"""

from __future__ import annotations

from typing import Any

from ..admission.spec import PolicyError
from ..bounds import shown
from .spec import ConcurrencySpec

__all__ = ["BUCKET_PREFIX", "SETTING", "bucket_name", "normalised", "queue_caps"]

SETTING = "extras_queue_concurrency"
#: A queue's bucket among the slot gate's specs: ``queue:<name>`` (no task has that name).
BUCKET_PREFIX = "queue:"
_EXPECTED = (
    "a dict of queue names to an int >= 1 (tasks at once in one worker) or to "
    "{'limit': int >= 1, 'scope': 'worker' or 'global', 'lease': seconds}"
)
_KEYS = {"limit", "scope", "lease"}


def bucket_name(queue: str) -> str:
    return BUCKET_PREFIX + queue


def _spec(key: str, queue: Any, value: Any) -> ConcurrencySpec:
    if isinstance(value, dict):
        unknown = set(value) - _KEYS
        if unknown or "limit" not in value:
            what = f"unknown key(s) {sorted(unknown)}" if unknown else "no 'limit'"
            raise PolicyError(f"{key}[{queue!r}]: {what}; expected {_EXPECTED}")
        limit, scope, lease = value["limit"], value.get("scope", "worker"), value.get("lease", 30.0)
    else:
        limit, scope, lease = value, "worker", 30.0
    try:
        return ConcurrencySpec.build(bucket_name(queue), limit, None, scope, lease)
    except PolicyError as exc:
        what = str(exc).split(": ", 1)[-1]  # without "concurrency() on task 'queue:...'"
        raise PolicyError(f"{key}[{queue!r}]: {what}") from None


def queue_caps(key: str, value: Any) -> dict[str, ConcurrencySpec]:
    """The caps *value* asks for, by queue; :class:`PolicyError` (a ``ValueError``) naming
    *key* and the queue when it is not :data:`_EXPECTED`."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(q, str) and q for q in value):
        raise PolicyError(f"{key}: expected {_EXPECTED}, got {shown(value)}")
    return {queue: _spec(key, queue, cap) for queue, cap in value.items()}


def normalised(key: str, value: Any) -> dict[str, dict[str, Any]]:
    """*value* checked (:func:`queue_caps`) and written out in full, as settings show it."""
    return {queue: {"limit": spec.n, "scope": spec.scope, "lease": spec.lease}
            for queue, spec in queue_caps(key, value).items()}  # fmt: skip
