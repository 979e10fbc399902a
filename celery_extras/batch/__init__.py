"""Batching: ``batch(size, wait=...)`` runs a task once for many messages (see :mod:`.gate`)."""

from .call import Call
from .spec import BatchSpec

__all__ = ["BatchSpec", "Call"]
