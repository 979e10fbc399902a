"""The no-op tasks :mod:`bench.gates` drains: one without a policy, one per gate set so that
it never binds (a rate no drain reaches, more slots than tasks, a distinct coalescing key
per task), and one with the three together."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from celery import shared_task

from celery_extras import coalesce, concurrency, limit

#: rate of the limits: far above what one worker drains
RATE = "100000/s"
#: slots of the concurrency caps: more than a drain ever runs at once
SLOTS = 10_000


def distinct(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """Each task its own coalescing key (its argument): coalescing never covers one."""
    return args[0] if args else None


@shared_task(name="bench.gates.plain")
def plain(tag: Any = None) -> Any:
    return tag


@limit(RATE, scope="worker")
@shared_task(name="bench.gates.worker_limit")
def worker_limit(tag: Any = None) -> Any:
    return tag


@limit(RATE, scope="global")
@shared_task(name="bench.gates.global_limit")
def global_limit(tag: Any = None) -> Any:
    return tag


@concurrency(SLOTS, scope="global")
@shared_task(name="bench.gates.global_slots")
def global_slots(tag: Any = None) -> Any:
    return tag


@coalesce(key=distinct)
@shared_task(name="bench.gates.coalesced")
def coalesced(tag: Any = None) -> Any:
    return tag


@limit(RATE, scope="global")
@concurrency(SLOTS, scope="global")
@coalesce(key=distinct)
@shared_task(name="bench.gates.all_three")
def all_three(tag: Any = None) -> Any:
    return tag
