"""What the key-run policies' specs share (no Celery import): the bounds of a hold's lease."""

from __future__ import annotations

from ..admission.spec import PolicyError
from ..checks import is_number

__all__ = ["MAX_LEASE", "MIN_LEASE", "lease_of", "seconds_of"]

#: Bounds of a key-run policy's ``lease``: a hold is renewed every third of its lease, so it
#: must outlast a few event-loop turns; a day is the longest a dead worker's key stays taken.
MIN_LEASE = 1.0
MAX_LEASE = 86400.0


def lease_of(where: str, lease: object) -> float:
    """*lease* in seconds, checked (:class:`PolicyError` naming *where* otherwise)."""
    if not is_number(lease, minimum=MIN_LEASE) or lease > MAX_LEASE:
        raise PolicyError(
            f"{where}: lease {lease!r}: expected seconds from {MIN_LEASE:g} to {MAX_LEASE:g}"
        )
    return float(lease)


def seconds_of(where: str, what: str, value: object, most: float) -> float:
    """*value* (argument *what*), seconds above 0 up to *most*, checked (:class:`PolicyError`
    naming *where* otherwise)."""
    if not is_number(value, above=0.0) or value > most:
        raise PolicyError(f"{where}: {what} {value!r}: expected seconds above 0, up to {most:g}")
    return float(value)
