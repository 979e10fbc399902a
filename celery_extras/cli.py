"""``celery -A proj extras ...``: the command-line side of celery-extras.

Registered through the ``celery.commands`` entry point, so every sub-command
gets the app from ``celery -A``. Commands stay thin: they parse, call into the
capability's module, and print.
"""

from __future__ import annotations

import json
from typing import Any

import click
from celery import Celery
from celery.bin.base import CeleryCommand, CLIContext

from .install import all_settings, settings_of

__all__ = ["extras"]


def app_of(ctx: click.Context) -> Celery:
    """The app named by ``celery -A``."""
    obj: CLIContext = ctx.obj
    app: Celery = obj.app
    return app


@click.group(name="extras")
def extras() -> None:
    """celery-extras: sync, limits, fair queues and throughput statistics."""


@extras.command(cls=CeleryCommand, name="settings")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def show_settings(ctx: click.Context, as_json: bool) -> None:
    """Show every extras_* setting as the app resolves it (defaults filled in)."""
    values: dict[str, Any] = settings_of(app_of(ctx))
    if as_json:
        click.echo(json.dumps({s.key: values[s.name] for s in all_settings()}, sort_keys=True))
        return
    for setting in all_settings():
        click.echo(f"{setting.key} = {values[setting.name]!r}")
