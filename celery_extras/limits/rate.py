"""Celery's rate syntax (``"10/s"``, ``"100/m"``, ``"1000/h"``) parsed to tokens per second.

Kept apart from Celery's own ``celery.utils.time.rate`` because that one
silently maps garbage to ``0`` (no limit); a limit that is meant to protect
something must fail loudly when it is mistyped.
"""

from __future__ import annotations

import math

from ..bounds import shown
from ..checks import is_int, is_number

__all__ = [
    "MAX_BURST",
    "MAX_RATE",
    "MIN_RATE",
    "RATE_UNITS",
    "check_rate",
    "format_rate",
    "parse_burst",
    "parse_rate",
]

#: Seconds per unit of Celery's rate syntax.
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}

#: Slowest rate accepted: one task a day (``"1/h"`` is fine, ``"0.01/h"`` is refused).
MIN_RATE = 1 / 86400
#: Fastest rate accepted: a million tasks a second (the global bucket counts microseconds).
MAX_RATE = 1_000_000.0
#: Largest burst accepted.
MAX_BURST = 100_000
#: Longest rate string accepted (``"1000000/s"`` with room for spaces and decimals).
_MAX_RATE_TEXT = 32
_RANGE = "between one a day (1/86400 per second) and 1000000/s"


def parse_rate(value: object) -> float:
    """Tokens per second for *value*: ``"10/s"``, ``"100/m"``, ``"1000/h"``, ``"5"`` or ``5``.

    Raises :class:`ValueError` naming what is wrong; a rate must lie between
    :data:`MIN_RATE` and :data:`MAX_RATE`.
    """
    if isinstance(value, bool):
        raise ValueError(f"rate {shown(value)}: expected e.g. '10/s', '100/m', '1000/h'")
    if isinstance(value, int | float):
        return check_rate(value)
    if isinstance(value, str):
        text = value.strip()
        if len(text) > _MAX_RATE_TEXT:
            raise ValueError(f"rate {shown(value)}: too long for a rate such as '10/s'")
        number, sep, unit = text.partition("/")
        unit = unit.strip().lower()
        if sep and unit not in RATE_UNITS:
            raise ValueError(f"rate {shown(value)}: unit must be one of s, m, h (as in '10/s')")
        try:
            count = float(number)
        except ValueError:
            raise ValueError(
                f"rate {shown(value)}: expected a number of tasks then /s, /m or /h (as in '10/s')"
            ) from None
        per = RATE_UNITS[unit] if sep else 1.0
    else:
        raise ValueError(f"rate {shown(value)}: expected a string such as '10/s', or a number")
    return check_rate(count / per, value)


def check_rate(per_second: object, culprit: object = None) -> float:
    """*per_second* as a float if it is a rate within bounds; :class:`ValueError` otherwise."""
    what = shown(per_second if culprit is None else culprit)
    if isinstance(per_second, bool) or not isinstance(per_second, int | float):
        raise ValueError(f"rate {what}: expected a number of tasks per second")
    try:
        rate = float(per_second)  # an int beyond any float overflows
    except OverflowError:
        rate = math.inf
    if not is_number(rate, minimum=MIN_RATE) or rate > MAX_RATE:
        raise ValueError(f"rate {what}: must be {_RANGE}")
    return rate


def parse_burst(value: object) -> int:
    """*value* if it is a burst within bounds (an integer 1..MAX_BURST); :class:`ValueError`."""
    if not is_int(value, minimum=1, maximum=MAX_BURST):
        raise ValueError(f"burst {shown(value)}: expected an integer from 1 to {MAX_BURST}")
    return value


def format_rate(per_second: float) -> str:
    """The shortest exact-looking spelling of *per_second* in Celery's syntax."""
    for unit in ("s", "m", "h"):
        count = per_second * RATE_UNITS[unit]
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}/{unit}"
    return f"{per_second:g}/s"
