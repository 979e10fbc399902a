"""Testing tasks that use celery-extras: the pytest plugin's pieces (``pip install
'celery-extras[testing]'`` registers :mod:`.plugin` with pytest)."""

from __future__ import annotations

from .clock import SimulatedClock
from .worker import SettlingWorker

__all__ = ["SettlingWorker", "SimulatedClock"]
