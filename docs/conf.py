"""Sphinx configuration for celery-extras."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_extras.compat import PRIVATE  # noqa: E402
from celery_extras.install import all_settings  # noqa: E402

project = "celery-extras"
author = "the celery-extras developers"
copyright = "2026, the celery-extras developers"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.intersphinx", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "celery-extras"
autodoc_typehints = "description"
intersphinx_mapping = {}
nitpicky = False


def _write_settings_table() -> None:
    """docs/_generated/settings.rst: one row per extras_* setting, from the settings registry."""
    rows = []
    for setting in all_settings():
        default = repr(setting.default)
        rows.append(
            f"   * - ``{setting.key}``\n     - ``{setting.kind}``\n"
            f"     - ``{default}``\n     - {setting.doc}\n"
        )
    table = (
        ".. list-table::\n   :header-rows: 1\n   :widths: 25 15 15 45\n\n"
        "   * - setting\n     - type\n     - default\n     - meaning\n" + "".join(rows)
    )
    out = Path(__file__).parent / "_generated"
    out.mkdir(exist_ok=True)
    (out / "settings.rst").write_text(table)


def _write_private_table() -> None:
    """docs/_generated/private.rst: one row per private Celery/kombu attribute in compat.py."""
    rows = []
    for entry in PRIVATE:
        since = f" (Celery {entry.since}+)" if entry.since else ""
        without = entry.fallback or "required: the worker does not start"
        rows.append(
            f"   * - ``{entry.name}``{since}\n     - {entry.expects}\n"
            f"     - {entry.used_by}\n     - {without}\n"
        )
    table = (
        ".. list-table::\n   :header-rows: 1\n   :widths: 30 25 25 20\n\n"
        "   * - attribute\n     - shape relied on\n     - used by\n     - without it\n"
        + "".join(rows)
    )
    out = Path(__file__).parent / "_generated"
    out.mkdir(exist_ok=True)
    (out / "private.rst").write_text(table)


_write_settings_table()
_write_private_table()
