"""Handing freed memory back to the operating system after a burst of revoke traffic.

glibc's allocator keeps the pages a burst once used (hundreds of thousands of
short-lived ids decoded from broadcasts and pulls) until ``malloc_trim`` asks it to
return them; a worker that handled 200,000 revokes keeps megabytes it no longer
uses. Other C libraries (musl, macOS) have no ``malloc_trim``: nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

__all__ = ["malloc_trim"]


@functools.cache
def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def malloc_trim() -> bool:
    """Ask the C allocator to return its free pages; ``False`` where it cannot."""
    trim = _libc_malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
