"""The consumer capability as ``install(app)`` wires it: settings, bootsteps, hooks."""

from __future__ import annotations

from ..capability import Capability

__all__ = ["CONSUMER"]

CONSUMER = Capability(name="consumer")
