"""``celery -A proj extras ...``: the command-line side of celery-extras.

Registered through the ``celery.commands`` entry point, so every sub-command
gets the app from ``celery -A``. Commands stay thin: they parse, call into the
capability's module, and print.
"""

from __future__ import annotations

import json
import time
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


@extras.command(cls=CeleryCommand, name="limit")
@click.argument("task_name")
@click.argument("rate")
@click.option("--burst", type=int, default=None, help="Tokens at once (default: the task's).")
@click.option("--timeout", type=float, default=1.0, show_default=True, help="Seconds to wait "
              "for the workers' replies.")  # fmt: skip
@click.pass_context
def limit_command(
    ctx: click.Context, task_name: str, rate: str, burst: int | None, timeout: float
) -> None:
    """Change the limit() of TASK_NAME to RATE (e.g. 10/s) on every worker, now and later."""
    from .policies.control import set_limit

    try:
        replies = set_limit(app_of(ctx), task_name, rate, burst, timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="RATE/--burst") from None
    click.echo(f"{task_name}: {rate} stored; workers started later apply it too")
    for reply in replies:
        for worker, answer in reply.items():
            click.echo(f"  {worker}: {answer.get('ok') or 'ERROR: ' + str(answer.get('error'))}")


@extras.command(cls=CeleryCommand, name="top")
@click.option("--refresh", default=1.0, show_default=True, help="Seconds between redraws.")
@click.option("--iterations", type=int, default=None, help="Draw this many frames, then exit.")
@click.option("--no-clear", is_flag=True, help="Append frames instead of redrawing in place.")
@click.pass_context
def top_command(ctx: click.Context, refresh: float, iterations: int | None, no_clear: bool) -> None:
    """Live table of task rates, failures and p95 runtime per worker and cluster-wide."""
    from .stats.monitor import top

    top(app_of(ctx), refresh=refresh, iterations=iterations, clear=not no_clear)


@extras.command(cls=CeleryCommand, name="exporter")
@click.option("--port", type=int, default=9808, show_default=True, help="Port of /metrics.")
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.pass_context
def exporter_command(ctx: click.Context, port: int, address: str) -> None:
    """Serve the workers' throughput figures to Prometheus on /metrics."""
    try:
        from .stats.prometheus import serve
    except ImportError as exc:
        raise click.ClickException(
            f"{exc}: install prometheus-client (pip install 'celery-extras[prometheus]')"
        ) from exc
    click.echo(f"celery-extras exporter: http://{address}:{port}/metrics", err=True)
    serve(app_of(ctx), port, address)


@extras.command(cls=CeleryCommand, name="revoked")
@click.option("--limit", type=int, default=20, show_default=True, help="Ids listed per holder.")
@click.option("--timeout", type=float, default=1.0, show_default=True, help="Seconds to wait "
              "for the workers' replies.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def revoked_command(ctx: click.Context, limit: int, timeout: float, as_json: bool) -> None:
    """List the revokes the cluster holds: the durable store, then each worker."""
    from .sync.control import cluster_revoked

    if not 0 <= limit <= 10000:
        raise click.BadParameter(f"{limit}: expected 0 to 10000", param_hint="--limit")
    listing = cluster_revoked(app_of(ctx), limit=limit, timeout=timeout)
    if as_json:
        click.echo(json.dumps(listing, sort_keys=True, default=str))
        return
    store = listing["store"]
    if "error" in store:
        click.echo(f"store: ERROR {store['error']}")
    else:
        click.echo(f"store: {store['ids']} ids, {store['stamps']} stamps "
                   f"(changes {store['seq']}, clock {store['clock']})")  # fmt: skip
        for task_id, expires_at in store["newest_ids"].items():
            click.echo(f"  {task_id}  (expires in {expires_at - time.time():.0f} s)")
        for header, value, expires_at in store["newest_stamps"]:
            click.echo(f"  {header}={value}  (expires in {expires_at - time.time():.0f} s)")
    for worker, reply in sorted(listing["workers"].items()):
        if not isinstance(reply, dict) or "error" in reply:
            click.echo(
                f"{worker}: ERROR {reply.get('error') if isinstance(reply, dict) else reply}"
            )
            continue
        sync = reply.get("sync", {})
        click.echo(f"{worker}: {sync.get('revoked')} ids, {sync.get('stamps')} stamps, "
                   f"clock {sync.get('clock')}, store {sync.get('store')}")  # fmt: skip
        for task_id in reply.get("ids", []):
            click.echo(f"  {task_id}")
        for header, value in reply.get("stamps", []):
            click.echo(f"  {header}={value}")
