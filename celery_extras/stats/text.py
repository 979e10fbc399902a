"""Names from events, made safe to show: control characters escaped, length bounded.

Hostnames and task names in ``worker-throughput`` events come from any sender on
the event exchange. Written raw to a terminal, ``\\x1b[2J`` clears the screen of
``extras top``; in a Prometheus label it reaches every dashboard. :func:`printable`
escapes every control, format and line/paragraph separator character (Unicode
categories ``Cc``, ``Cf``, ``Zl``, ``Zp``, which include ESC, BEL, CR, DEL, the C1
controls and the bidirectional overrides) as ``\\xNN``/``\\uNNNN``, as Python's
``repr`` would, so the name stays recognisable and distinct. :func:`window_label`
writes a window's length as ``extras top`` and the Flower page show it.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

__all__ = ["printable", "truncate", "window_label"]

_UNSAFE = frozenset(("Cc", "Cf", "Zl", "Zp"))


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


@lru_cache(maxsize=4096)
def printable(text: str) -> str:
    """*text* with every control or format character escaped (a backslash stays one)."""
    if text.isprintable():
        return text
    return "".join(
        _escape(char) if unicodedata.category(char) in _UNSAFE else char for char in text
    )


def truncate(text: str, width: int) -> str:
    """*text* cut to *width* characters, its end marked with ``~`` when cut."""
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: width - 1] + "~"


def window_label(seconds: float) -> str:
    """A window's length as shown: ``1h``, ``5m``, ``10s``, ``2.5s``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"
