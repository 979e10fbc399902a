"""Every covered caller's result: the result of the run that covered it.

When a coalesced run ends, the worker's main process copies the run's stored state
(success with its result, failure with its exception and traceback, revoked) to each
id the run covered, through the app's result backend, so ``AsyncResult(id).get()``
returns for every message sent, as Celery's own clients expect. A covered message revoked
before its run ended stays revoked (Celery 5.7 marks it so at once; older releases do
not, so the copy does). The run's own state is
written by Celery (its pool process, or the main process for a timeout or a lost
process) around the time the pipeline hears the end, so the copy waits for it.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, states
from celery.backends.base import DisabledBackend

from .. import compat

__all__ = ["ATTEMPTS", "SPACING", "ResultCopies"]

logger = logging.getLogger("celery_extras.coalesce")

#: How many times (every :data:`SPACING` seconds) a run's state is read before giving up.
ATTEMPTS = 25
SPACING = 0.2


class ResultCopies:
    """Copies finished runs' results to the ids they covered, from the consumer's timer."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.copied = 0
        self.gave_up = 0

    def stores_results(self, name: str) -> bool:
        task = self.app.tasks.get(name)
        ignored = task.ignore_result if task is not None else self.app.conf.task_ignore_result
        return not ignored and not isinstance(self.app.backend, DisabledBackend)

    def schedule(self, consumer: Any, name: str, run_id: str, covered: list[str]) -> None:
        """Copy *run_id*'s result to *covered* once Celery stored it."""
        if covered and self.stores_results(name):
            consumer.timer.call_after(0.0, self._copy, (consumer, run_id, covered, 1), priority=6)

    def _copy(self, consumer: Any, run_id: str, covered: list[str], attempt: int) -> None:
        backend = self.app.backend
        try:
            meta = backend.get_task_meta(run_id)
            state = meta.get("status")
            if state not in states.READY_STATES:
                if attempt < ATTEMPTS:
                    again = (consumer, run_id, covered, attempt + 1)
                    consumer.timer.call_after(SPACING, self._copy, again, priority=6)
                    return
                self.gave_up += len(covered)
                logger.warning(
                    "celery-extras: run %s of a coalesced task has no result after %.0f s "
                    "(state %s); the %d message(s) it covered keep theirs pending",
                    run_id, ATTEMPTS * SPACING, state, len(covered),
                )  # fmt: skip
                return
            revoked = compat.worker_revoked()
            for one in covered:
                if one in revoked:  # revoked after it was covered: it stays revoked
                    backend.mark_as_revoked(one, reason="revoked")
                    continue
                backend.store_result(one, meta.get("result"), state, meta.get("traceback"))
                self.copied += 1
        except Exception:
            self.gave_up += len(covered)
            logger.exception(
                "celery-extras: copying the result of coalesced run %s to the %d message(s) "
                "it covered failed", run_id, len(covered),
            )  # fmt: skip
