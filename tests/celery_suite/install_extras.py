"""pytest plugin: ``celery_extras.install(app)`` on every Celery app the suite creates.

Load it with ``-p tests.celery_suite.install_extras`` (``python -m tests.celery_suite.run``
does, for its ``with-extras`` run). Nothing of the suite itself is changed.

The fixtures of ``celery.contrib.pytest`` (``celery_app``, ``celery_session_app``) build
their apps with ``celery.contrib.testing.app.TestApp``, which calls ``Celery(...)``; some
tests of ``t/integration`` call ``Celery(...)`` themselves. Both go through
``Celery.__init__``, so that is what this plugin wraps: when it returns, the app gets
``celery_extras.install(app)``, as a user calls it right after ``app = Celery(...)``.
Apps in processes the tests start themselves (``celery worker`` run with ``subprocess``)
are not affected: they have no user module that could install it.

With ``EXTRAS_SUITE_POLICIES=1`` in the environment (``run.py``'s ``with-policies`` mode)
every task defined with ``@shared_task`` from then on (all of ``t/integration/tasks.py``)
also gets policies that should change nothing Celery does, stacked (:func:`police`): a
generous global ``limit()``, a large ``concurrency()`` and a ``coalesce()`` whose key is
new each time it is computed, so that no two messages share one (see :func:`fresh_key`).
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import celery
import pytest
from celery import Celery

import celery_extras
from celery_extras import coalesce, concurrency, limit

_lock = threading.Lock()
_installed_on = 0  # how many apps got install() (the terminal summary shows it)
_policed: list[str] = []  # the tasks that got the stacked policies

#: The environment variable that turns the stacked policies on.
POLICIES_ENV = "EXTRAS_SUITE_POLICIES"
#: The stacked policies: far above what the suite sends (a few hundred tasks, a few dozen at
#: once), so a task never waits for them; each still takes its token, its slot, its hold.
RATE, BURST, SLOTS = "1000/s", 1000, 1000


def fresh_key(args: Any, kwargs: Any) -> str:
    """A coalescing key of its own for each message.

    The key callable sees a message's ``(args, kwargs)``, not its id, and two messages of a
    canvas may have the same arguments (``group(add.s(1, 1), add.s(1, 1))``), so no function
    of the arguments alone is per message. A key is computed once per arrival of a message
    at a worker: a random one is that message's own. What it cannot be: the same key for a
    message's next arrival (its retry, a redelivery, its release from the delay store),
    which therefore runs under a key of its own too instead of joining its earlier hold (a
    key held by a retried run frees at its lease's end).
    """
    return uuid.uuid4().hex


def police(task: Any) -> Any:
    """*task* (a ``@shared_task`` proxy) with the stacked policies."""
    name = getattr(task, "name", "?")
    _policed.append(str(name))
    stacked = coalesce(key=fresh_key)(concurrency(SLOTS)(limit(RATE, burst=BURST)(task)))
    return stacked


def _policing(shared_task: Callable[..., Any]) -> Callable[..., Any]:
    """``shared_task`` whose every task gets :func:`police`, used bare or with options."""

    @functools.wraps(shared_task)
    def policed_shared_task(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return police(shared_task(args[0]))
        decorate = shared_task(*args, **kwargs)
        return lambda fun: police(decorate(fun))

    return policed_shared_task


def _wrap(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def init_then_install(self: Celery, *args: Any, **kwargs: Any) -> None:
        global _installed_on
        init(self, *args, **kwargs)
        celery_extras.install(self)
        with _lock:
            _installed_on += 1

    return init_then_install


# Wrapped on import (``-p`` imports the plugin before the suite's conftest.py and test
# modules), so an app made while they import gets it too; undone when pytest ends.
_original_init = Celery.__init__
Celery.__init__ = _wrap(_original_init)
_original_shared_task = celery.shared_task
if os.environ.get(POLICIES_ENV) == "1":  # before t/integration/tasks.py imports shared_task
    celery.shared_task = _policing(_original_shared_task)


def pytest_unconfigure(config: pytest.Config) -> None:
    Celery.__init__ = _original_init
    celery.shared_task = _original_shared_task


def pytest_report_header(config: pytest.Config) -> str:
    policies = (
        f"; limit({RATE!r}, burst={BURST}), concurrency({SLOTS}) and coalesce(key=<per message>) "
        "on every @shared_task"
        if os.environ.get(POLICIES_ENV) == "1"
        else ""
    )
    return (
        f"celery-extras {_extras_version()}: celery_extras.install(app) on every Celery app "
        f"(tests.celery_suite.install_extras){policies}"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # run.py reads these lines to check that the plugin was in effect
    terminalreporter.write_line(f"celery_extras.install(app) ran on {_installed_on} Celery apps")
    if os.environ.get(POLICIES_ENV) == "1":
        terminalreporter.write_line(f"policies stacked on {len(_policed)} tasks")


def _extras_version() -> str:
    try:
        return version("celery-extras")
    except PackageNotFoundError:
        return "(not installed)"
