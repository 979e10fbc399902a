"""Time-wheel throughput statistics per task, emitted as Celery events.

Pure parts (no Celery import): :class:`TimeWheel` (ring of buckets reset lazily
by round, with a coarser wheel behind it), :class:`Histogram` (fixed log-scale
runtimes), :class:`Recorder` (a wheel per task name), :mod:`.schema` (the event,
checked) and :mod:`.gauges` (the worker's gauges, declared once). Celery glue:
:mod:`.recording` (worker step counting in the main process), :mod:`.emitter`
(``worker-throughput`` events and ``inspect stats``), :mod:`.listener`,
:mod:`.monitor` (``celery extras top``), :mod:`.prometheus` and :mod:`.flower`
(the page in Flower).
"""

from .histogram import Histogram
from .recorder import COUNTERS, LockedRecorder, Recorder
from .schema import Malformed, Throughput, parse
from .timewheel import TimeWheel, minute_wheel

__all__ = [
    "COUNTERS",
    "Histogram",
    "LockedRecorder",
    "Malformed",
    "Recorder",
    "Throughput",
    "TimeWheel",
    "minute_wheel",
    "parse",
]
