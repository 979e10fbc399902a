"""The policies capability as ``install(app)`` wires it: settings, bootsteps, hooks."""

from __future__ import annotations

from ..capability import Capability

__all__ = ["POLICIES"]

POLICIES = Capability(name="policies")
