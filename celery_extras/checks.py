"""The value checks every part of celery-extras shares (settings, decorators, control, wire).

Pure predicates, no Celery import: a bool is never a number here (``True`` is an
``int`` to Python, never a count or a rate to a user), and a number must be finite.
Each caller words its own error, naming its own culprit.
"""

from __future__ import annotations

import math
from typing import TypeGuard

__all__ = ["is_int", "is_number"]


def is_int(value: object, minimum: int | None = None, maximum: int | None = None) -> TypeGuard[int]:
    """*value* is an ``int`` (not a bool) within ``[minimum, maximum]``."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and (minimum is None or value >= minimum)
        and (maximum is None or value <= maximum)
    )


_FLOAT_MAX = 2**1024  # ints from here on overflow float()


def is_number(
    value: object, minimum: float | None = None, above: float | None = None
) -> TypeGuard[int | float]:
    """*value* is a finite ``int`` or ``float`` (not a bool), ``>= minimum`` and ``> above``.

    An ``int`` beyond any float (``10**400``) is not finite here: nothing could use it.
    """
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (abs(value) < _FLOAT_MAX if isinstance(value, int) else math.isfinite(value))
        and (minimum is None or value >= minimum)
        and (above is None or value > above)
    )
