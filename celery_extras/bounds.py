"""Bounds on numbers and text that cross a boundary: control arguments, the CLI, the store.

Pure, no Celery import. A value out of bounds is refused where it enters, with a
message naming it; :func:`shown` keeps such messages (and the replies that carry
them) short whatever the size of the culprit.
"""

from __future__ import annotations

import math

__all__ = ["MAX_SHOWN", "MAX_WAIT", "clamp_wait", "cut", "shown"]

#: Longest wait (seconds) ever handed to a timer, a ``timedelta`` or a Redis expiry:
#: 30 days. A longer wait is not booked; the task waits this long, then asks again.
MAX_WAIT = 30 * 86400.0

#: Characters of a culprit quoted in an error message or reply.
MAX_SHOWN = 80


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """``repr(value)``, cut to *limit* characters with the full length said."""
    try:
        text = repr(value)
    except Exception as exc:  # a hostile __repr__ must not replace the real error
        text = f"<unprintable {type(value).__name__}: {type(exc).__name__}>"
    return cut(text, limit)


def cut(text: str, limit: int = MAX_SHOWN) -> str:
    """*text*, cut to *limit* characters with the full length said."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def clamp_wait(seconds: float) -> float:
    """*seconds* within ``0 .. MAX_WAIT`` (NaN counts as the longest wait)."""
    if not seconds > 0:
        return 0.0 if not math.isnan(seconds) else MAX_WAIT
    return min(seconds, MAX_WAIT)
