"""Tasks of the canvas tests: Celery's canvas (chain, group, chord, link, link_error,
``self.replace``) under each policy, and the messages coalescing covers.

Each policy has a column: a task adding 1 to its argument (``<column>_add``) and one that
always fails (``<column>_fail``), so a canvas has the same figures whatever the column:
limited (``limit()``, waits, parks past ``extras_limit_max_hold``), capped
(``concurrency(1)``, waits), coalesced (``coalesce()`` on the arguments: a message covered
by a run of the same arguments gets the same result), retried (``retry_policy()``: the
first attempt fails) and eta (no policy: the test gives it a countdown, parked in the
delay store by ``extras_eta_store``).
"""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task

from celery_extras import ExponentialBackoff, coalesce, concurrency, limit, retry_policy

from .journal import Journal

__all__ = [
    "COLUMNS",
    "capped_add",
    "capped_fail",
    "co",
    "co_fail",
    "coalesced_add",
    "coalesced_fail",
    "eta_add",
    "eta_fail",
    "limited_add",
    "limited_fail",
    "record",
    "replacer",
    "retried_add",
    "retried_fail",
    "total",
    "tsum",
]

COLUMNS = ("limited", "capped", "coalesced", "retried", "eta")


class Failed(ValueError):
    """What the ``*_fail`` tasks raise."""


def _first_arg(args: Any, kwargs: Any) -> str:
    return str(args[0])


def _arguments(args: Any, kwargs: Any) -> str:
    return repr((list(args), sorted(kwargs.items())))


# -- the covered rows (tests/integration/test_coalesce.py) ---------------------------------------


@coalesce(key=_first_arg)
@shared_task(bind=True, name="tests.canvas.co")
def co(self: Task, key: str, tag: Any, seconds: float = 0.2) -> Any:
    """One run per *key* at a time; journals its run; returns its own *tag*, so each covered
    message's result names the run that covered it."""
    Journal(self.app.main or "extras-test").note(self, phase="run", key=key, tag=tag)
    time.sleep(seconds)
    return tag


@coalesce(key=_first_arg)
@shared_task(bind=True, name="tests.canvas.co_fail")
def co_fail(self: Task, key: str, tag: Any, seconds: float = 0.2) -> Any:
    """As :func:`co`, and raises :class:`Failed` naming its tag."""
    Journal(self.app.main or "extras-test").note(self, phase="run", key=key, tag=tag)
    time.sleep(seconds)
    raise Failed(f"run {tag} failed")


@shared_task(bind=True, name="tests.canvas.record")
def record(self: Task, tag: Any, *rest: Any) -> Any:
    """A callback or errback: journals that it ran, and what it was given."""
    Journal(self.app.main or "extras-test").note(self, phase="callback", tag=tag, given=rest)
    return tag


@shared_task(name="tests.canvas.total")
def total(values: list[Any]) -> list[Any]:
    """A chord body: the parts' results, sorted."""
    return sorted(values)


@shared_task(name="tests.canvas.tsum")
def tsum(values: list[Any]) -> Any:
    """A chord body: the sum of the parts' results."""
    return sum(values)


# -- the matrix (tests/integration/test_canvas.py) -----------------------------------------------


@limit("5/s", burst=1)
@shared_task(name="tests.canvas.limited_add")
def limited_add(x: int) -> int:
    return x + 1


@limit("5/s", burst=1)
@shared_task(name="tests.canvas.limited_fail")
def limited_fail(x: int) -> int:
    raise Failed(f"limited {x}")


@concurrency(1)
@shared_task(name="tests.canvas.capped_add")
def capped_add(x: int) -> int:
    time.sleep(0.05)
    return x + 1


@concurrency(1)
@shared_task(name="tests.canvas.capped_fail")
def capped_fail(x: int) -> int:
    time.sleep(0.05)
    raise Failed(f"capped {x}")


@coalesce(key=_arguments)
@shared_task(name="tests.canvas.coalesced_add")
def coalesced_add(x: int) -> int:
    time.sleep(0.05)
    return x + 1


@coalesce(key=_arguments)
@shared_task(name="tests.canvas.coalesced_fail")
def coalesced_fail(x: int) -> int:
    time.sleep(0.05)
    raise Failed(f"coalesced {x}")


BACKOFF = ExponentialBackoff(base=0.05, cap=0.1)


@retry_policy(on=Failed, policy=BACKOFF, max_retries=2)
@shared_task(bind=True, name="tests.canvas.retried_add")
def retried_add(self: Task, x: int) -> int:
    """Fails on its first attempt, then adds 1."""
    if not self.request.retries:
        raise Failed(f"retried {x}, first attempt")
    return x + 1


@retry_policy(on=Failed, policy=BACKOFF, max_retries=1)
@shared_task(name="tests.canvas.retried_fail")
def retried_fail(x: int) -> int:
    raise Failed(f"retried {x}")


@shared_task(name="tests.canvas.eta_add")
def eta_add(x: int) -> int:
    return x + 1


@shared_task(name="tests.canvas.eta_fail")
def eta_fail(x: int) -> int:
    raise Failed(f"eta {x}")


@shared_task(bind=True, name="tests.canvas.replacer")
def replacer(self: Task, x: int, column: str, countdown: float = 0.0) -> Any:
    """Replaces itself with ``<column>_add(x)``."""
    step = self.app.tasks[f"tests.canvas.{column}_add"].s(x)
    if countdown:
        step.set(countdown=countdown)
    return self.replace(step)
