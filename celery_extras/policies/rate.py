"""Celery's rate syntax (``"10/s"``, ``"100/m"``, ``"1000/h"``) parsed to tokens per second.

Kept apart from Celery's own ``celery.utils.time.rate`` because that one
silently maps garbage to ``0`` (no limit); a limit that is meant to protect
something must fail loudly when it is mistyped.
"""

from __future__ import annotations

import math

__all__ = ["RATE_UNITS", "format_rate", "parse_rate"]

#: Seconds per unit of Celery's rate syntax.
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate(value: object) -> float:
    """Tokens per second for *value*: ``"10/s"``, ``"100/m"``, ``"1000/h"``, ``"5"`` or ``5``.

    Raises :class:`ValueError` naming what is wrong; a rate must be finite and > 0.
    """
    if isinstance(value, bool):
        raise ValueError(f"rate {value!r}: expected e.g. '10/s', '100/m', '1000/h'")
    if isinstance(value, int | float):
        count, per = float(value), 1.0
    elif isinstance(value, str):
        text = value.strip()
        number, sep, unit = text.partition("/")
        unit = unit.strip().lower()
        if sep and unit not in RATE_UNITS:
            raise ValueError(f"rate {value!r}: unit must be one of s, m, h (as in '10/s')")
        try:
            count = float(number)
        except ValueError:
            raise ValueError(
                f"rate {value!r}: expected a number of tasks then /s, /m or /h (as in '10/s')"
            ) from None
        per = RATE_UNITS[unit] if sep else 1.0
    else:
        raise ValueError(f"rate {value!r}: expected a string such as '10/s', or a number")
    if not math.isfinite(count) or count <= 0:
        raise ValueError(f"rate {value!r}: must be a finite number of tasks > 0")
    return count / per


def format_rate(per_second: float) -> str:
    """The shortest exact-looking spelling of *per_second* in Celery's syntax."""
    for unit in ("s", "m", "h"):
        count = per_second * RATE_UNITS[unit]
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}/{unit}"
    return f"{per_second:g}/s"
