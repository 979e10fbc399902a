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
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pytest
from celery import Celery

import celery_extras

_lock = threading.Lock()
_installed_on = 0  # how many apps got install() (the terminal summary shows it)


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


def pytest_unconfigure(config: pytest.Config) -> None:
    Celery.__init__ = _original_init


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"celery-extras {_extras_version()}: celery_extras.install(app) on every Celery app "
        "(tests.celery_suite.install_extras)"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # run.py reads this line to check that the plugin was in effect
    terminalreporter.write_line(f"celery_extras.install(app) ran on {_installed_on} Celery apps")


def _extras_version() -> str:
    try:
        return version("celery-extras")
    except PackageNotFoundError:
        return "(not installed)"
