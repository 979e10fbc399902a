"""The app of docs/policies.rst as its Python blocks declare it, for the real worker of
tests/docs/test_docs_blocks.py (broker, store and key prefix from the environment)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

import celery_extras
from tests.docs.blocks import DOCS, python_blocks

__all__ = ["app"]

app = celery_extras.install(
    Celery("proj", broker=os.environ["DOCS_BROKER"], set_as_current=False),
    redis_url=os.environ["DOCS_BROKER"],
    key_prefix=os.environ["DOCS_PREFIX"],
)
names: dict[str, Any] = {"__name__": "proj", "app": app}
for block in python_blocks(DOCS / "policies.rst"):
    exec(compile(block.text, f"docs/policies.rst:{block.line}", "exec"), names)
