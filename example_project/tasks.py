"""Plain tasks of the example project."""

from __future__ import annotations

from .app import app

__all__ = ["add"]


@app.task
def add(x: int, y: int) -> int:
    return x + y
