"""Tasks of the debounce tests: each run journals its start and its end (one entry, at the
end, with ``start``; plus a ``phase="start"`` entry when asked) on the host's clock, and
returns what it ran with, so every caller's result names the run that covered it."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task

from celery_extras import debounce

from .journal import Journal

__all__ = ["LEASE", "MAX_WAIT", "WAIT", "save"]

#: The quiet period, its bound and the lease of ``save``: short, so the tests are.
WAIT, MAX_WAIT, LEASE = 0.5, 2.0, 3.0


def _key(args: Any, kwargs: Any) -> str:
    return str(args[0])


@debounce(WAIT, key=_key, max_wait=MAX_WAIT, lease=LEASE)
@shared_task(bind=True, name="tests.debounce.save")
def save(self: Task, key: str, tag: Any = None, seconds: float = 0.05,
         announce: bool = False) -> dict[str, Any]:  # fmt: skip
    journal = Journal(self.app.main or "extras-test")
    start = time.time()
    if announce:
        journal.note(self, phase="start", key=key, tag=tag, start=start)
    time.sleep(seconds)
    journal.note(self, phase="end", key=key, tag=tag, start=start)
    return {"key": key, "tag": tag, "run": self.request.id}
