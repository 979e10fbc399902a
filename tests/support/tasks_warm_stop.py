"""Tasks of the warm-stop tests: a batched task whose batches journal each call's start, and
hold while the test keeps them running."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from celery_extras import Call, batch

from .journal import Journal

__all__ = ["HELD", "batched"]

#: The tag of a call whose batch holds until the test raises the journal's flag ``go``
HELD = "held"


@batch(size=3, wait=60.0)
@shared_task(bind=True, name="tests.warm_stop.batched", acks_late=True)
def batched(self: Task, calls: list[Call]) -> list[Any]:
    """Journals each call's start (under the call's id); a batch with a :data:`HELD` call
    then waits for the flag ``go``."""
    journal = Journal(self.app.main or "extras-test")
    journal.note_calls(self, calls)
    if any(call.args[1] == HELD for call in calls):
        journal.wait_for_flag("go", timeout=60.0)
    return [call.args[1] for call in calls]
