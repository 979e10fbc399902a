"""``coalesce()``'s arguments, and the send time a worker reads from a message."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_extras import PolicyError, coalesce
from celery_extras.admission.sent import SENT_HEADER, sent_at, stamp_sent, stamped_tasks
from celery_extras.coalesce.spec import CoalesceSpec

NOW = 1_800_000_000.0


def key(args: Any, kwargs: Any) -> str:
    return str(args[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": "account"}, "key 'account': expected a callable (args, kwargs) -> key"),
        ({"key": key, "keep": "middle"}, "keep 'middle': expected 'first' or 'last'"),
        ({"key": key, "lease": 0.5}, "lease 0.5: expected seconds from 1 to 86400"),
        ({"key": key, "lease": math.inf}, "lease inf: expected seconds from 1 to 86400"),
        ({"key": key, "lease": True}, "lease True: expected seconds from 1 to 86400"),
        ({"key": key, "lease": "30"}, "lease '30': expected seconds from 1 to 86400"),
    ],
)
def test_bad_arguments_name_the_task_and_the_argument(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError) as raised:
        CoalesceSpec.build("proj.reindex", kwargs.get("key"), kwargs.get("keep", "first"),
                           kwargs.get("lease", 30.0))  # fmt: skip
    assert str(raised.value) == f"coalesce() on task 'proj.reindex': {message}"


def test_the_decorator_refuses_what_is_not_a_task() -> None:
    with pytest.raises(TypeError, match="coalesce"):
        coalesce(key=key)(lambda: None)


def test_a_producer_stamps_only_stamped_tasks_and_keeps_a_first_stamp() -> None:
    stamped_tasks.add("proj.reindex")
    try:
        stamped: dict[str, Any] = {}
        stamp_sent(sender="proj.reindex", headers=stamped, clock=lambda: NOW)
        assert stamped == {SENT_HEADER: NOW}
        other: dict[str, Any] = {}
        stamp_sent(sender="proj.other", headers=other, clock=lambda: NOW)
        assert other == {}  # a task with no coalesce(): its message is not touched
        again = {SENT_HEADER: NOW - 60}
        stamp_sent(sender="proj.reindex", headers=again, clock=lambda: NOW)
        assert again == {SENT_HEADER: NOW - 60}  # published again: the first send counts
    finally:
        stamped_tasks.discard("proj.reindex")


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        (NOW - 5, NOW - 5),
        (None, NOW),  # no stamp (send_task from an app without celery-extras): arrival
        (NOW + 3600, NOW),  # from the future (forged, or a skewed clock): now
        ("yesterday", NOW),
        (math.nan, NOW),
        (-1.0, NOW),
        (True, NOW),
        (10**400, NOW),
        ([NOW - 5], NOW),
    ],
)
def test_the_send_time_is_the_stamp_or_the_arrival(stamp: Any, expected: float) -> None:
    headers = {} if stamp is None else {SENT_HEADER: stamp}
    assert sent_at(headers, None, NOW) == expected


def test_a_message_with_an_eta_counts_as_sent_at_its_eta() -> None:
    """A run before the ETA does not do the work the message asks for at its ETA."""
    stamp = {SENT_HEADER: NOW - 60}
    eta = datetime.fromtimestamp(NOW - 10, UTC)
    assert sent_at(stamp, eta.isoformat(), NOW) == NOW - 10
    assert sent_at(stamp, eta, NOW) == NOW - 10
    assert sent_at(stamp, eta.replace(tzinfo=None) + timedelta(hours=0), NOW) == NOW - 10
    assert sent_at(stamp, (eta + timedelta(hours=1)).isoformat(), NOW) == NOW  # not due yet
    assert sent_at(stamp, "not a date", NOW) == NOW - 60
    assert sent_at(stamp, 12345, NOW) == NOW - 60
