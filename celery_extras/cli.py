"""``celery -A proj extras ...``: the command-line side of celery-extras.

Registered through the ``celery.commands`` entry point, so every sub-command
gets the app from ``celery -A``. Commands stay thin: they parse, call into the
capability's module, and print. Loading the entry point also extends Celery's own
``celery purge``: once it has emptied the broker's queues, it drops what the delay
store holds for them (:func:`purge_parked_too`).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import sys
import time
from collections.abc import Iterator
from typing import Any

import click
from celery import Celery
from celery.bin.base import CeleryCommand, CLIContext
from kombu.utils.url import maybe_sanitize_url

from . import compat
from .bounds import cut, shown
from .limits.spec import limit_id
from .settings import declared_settings, settings_of

__all__ = [
    "answering_store",
    "did_you_mean",
    "extras",
    "known_task",
    "purge_parked_too",
    "store_down",
]


def app_of(ctx: click.Context) -> Celery:
    """The app named by ``celery -A``."""
    obj: CLIContext = ctx.obj
    app: Celery = obj.app
    return app


def did_you_mean(app: Celery, name: str) -> str:
    """``"; did you mean a.b?"`` naming the app's task closest to *name* (``""``: none)."""
    names = [n for n in app.tasks if not n.startswith("celery.")]
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def known_task(app: Celery, name: str) -> None:
    """Refuse *name* unless it is a task of the app (its task modules imported, as a worker
    imports them), naming the closest: a typo must not store a setting nobody reads."""
    try:
        app.loader.import_default_modules()
    except Exception:  # the project's modules may need what only workers have: cannot tell
        return
    if name not in app.tasks:
        raise click.ClickException(
            f"{name}: no task of this app has that name{did_you_mean(app, name)}"
        )


def store_down(app: Celery, reason: str) -> click.ClickException:
    """The one-line error (exit 1) of a command whose store does not answer, for *reason*."""
    from .store.client import store_url

    url = store_url(app)
    where = f"the store at {maybe_sanitize_url(url)}" if url else "the store"
    return click.ClickException(
        f"store down: {where} does not answer ({cut(' '.join(reason.split()), 200)})"
    )


@contextlib.contextmanager
def answering_store(app: Celery) -> Iterator[None]:
    """Turn a store error in the block into :func:`store_down`'s line, not a traceback."""
    from .delay.parking import STORE_ERRORS

    try:
        yield
    except STORE_ERRORS as exc:
        raise store_down(app, f"{type(exc).__name__}: {exc}") from None


class Seconds(click.FloatRange):
    """A finite number of seconds within a range (``nan`` and ``inf`` are refused)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


@click.group(name="extras")
def extras() -> None:
    """celery-extras: sync, limits, fair queues and throughput statistics."""


@extras.command(cls=CeleryCommand, name="settings")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def show_settings(ctx: click.Context, as_json: bool) -> None:
    """Show every extras_* setting as the app resolves it (defaults filled in)."""
    app = app_of(ctx)
    values = settings_of(app)
    if as_json:
        click.echo(
            json.dumps({s.key: values[s.name] for s in declared_settings(app)}, sort_keys=True)
        )
        return
    for setting in declared_settings(app):
        click.echo(f"{setting.key} = {values[setting.name]!r}")


@extras.command(cls=CeleryCommand, name="limit")
@click.argument("task_name", required=False)
@click.argument("rate", required=False)
@click.option("--burst", type=int, default=None, help="Tokens at once (default: the task's).")
@click.option("--key", default=None, help="Only for this key of a per-key limit (one "
              "customer's plan); other keys keep theirs.")  # fmt: skip
@click.option("--limit", "which", type=click.IntRange(1, 1000), default=None,
              help="Which limit() of a task that has several: its place, top first (as "
              "--show lists them).")  # fmt: skip
@click.option("--show", is_flag=True, help="List the limited tasks: stored rates and what each "
              "worker applies (TASK_NAME narrows it to one task).")  # fmt: skip
@click.option("--reset", is_flag=True, help="Remove TASK_NAME's stored rate: back to its "
              "limit() on every worker, now and later.")  # fmt: skip
@click.option("--timeout", type=Seconds(min=0.1, max=60), default=1.0,
              show_default=True, help="Seconds to wait for the workers' replies.")  # fmt: skip
@click.pass_context
def limit_command(
    ctx: click.Context,
    task_name: str | None,
    rate: str | None,
    burst: int | None,
    key: str | None,
    which: int | None,
    show: bool,
    reset: bool,
    timeout: float,
) -> None:
    """Change the limit() of TASK_NAME to RATE (e.g. 10/s) on every worker, now and later.

    \b
    celery -A proj extras limit TASK_NAME RATE [--burst N] [--key K] [--limit N]
    celery -A proj extras limit --show [TASK_NAME]
    celery -A proj extras limit --reset TASK_NAME [--key K] [--limit N]
    """
    from .limits.control import limited_tasks, reset_limit, set_limit, show_limits

    app = app_of(ctx)
    if show and reset:
        raise click.UsageError("--show and --reset do not go together")
    if key is not None and not 0 < len(key) <= 200:
        raise click.BadParameter("expected 1 to 200 characters", param_hint="--key")
    if show:
        if rate is not None or burst is not None or key is not None or which is not None:
            raise click.UsageError("--show takes only TASK_NAME")
        with answering_store(app):
            limits = show_limits(app, timeout)
        _show_limits(app, limits, task_name)
        return
    if reset and (rate is not None or burst is not None):
        raise click.UsageError("RATE and --burst go only with setting a limit")
    if task_name is None or (rate is None and not reset):
        raise click.UsageError("TASK_NAME and RATE are needed (or --show, or --reset TASK_NAME)")
    which = _which_limit(app, task_name, which, limited_tasks(app, timeout))
    for_key = f" for key {key!r}" if key else ""
    if reset:
        with answering_store(app):
            replies = reset_limit(app, task_name, timeout, key, which)
        click.echo(f"{task_name}{for_key}: stored rate removed; workers use its limit() again")
        _echo_replies(replies)
        return
    assert rate is not None
    try:
        with answering_store(app):
            replies = set_limit(app, task_name, rate, burst, timeout, key, which)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="RATE/--burst") from None
    click.echo(f"{task_name}{for_key}: {rate} stored; workers started later apply it too")
    _echo_replies(replies)


def _which_limit(app: Celery, task_name: str, which: int | None, known: dict[str, Any]) -> int:
    """The place (1-based) of the limit() of *task_name* a change is for."""
    if task_name not in known:
        names = ", ".join(sorted(known)) or "none"
        hint = "" if task_name in app.tasks else did_you_mean(app, task_name)
        raise click.ClickException(
            f"{task_name}: no worker limits this task and the app declares no limit() for it; "
            f"nothing stored (limited tasks: {names}){hint}"
        )
    declared = known[task_name]["app"] or []
    if which is None and len(declared) > 1:
        listed = ", ".join(f"{i}: {d['rate']}" for i, d in enumerate(declared, 1))
        raise click.UsageError(f"{task_name} has {len(declared)} limit()s: name one with "
                               f"--limit N ({listed})")  # fmt: skip
    if which is not None and declared and which > len(declared):
        raise click.BadParameter(f"{task_name} has {len(declared)} limit()s", param_hint="--limit")
    return which or 1


def _echo_replies(replies: list[dict[str, Any]]) -> None:
    for reply in replies:
        for worker, answer in reply.items():
            click.echo(f"  {worker}: {answer.get('ok') or 'ERROR: ' + str(answer.get('error'))}")


def _show_limits(app: Celery, shown: dict[str, Any], only: str | None) -> None:
    stored: dict[str, str] = shown["stored"]
    tasks: dict[str, Any] = shown["tasks"]
    names = sorted({_stored_task(field) for field in stored} | set(tasks))
    if only is not None:
        names = [n for n in names if n == only]
        if not names:
            hint = "" if only in app.tasks else did_you_mean(app, only)
            raise click.ClickException(
                f"{only}: no worker limits this task, and no rate is stored{hint}"
            )
    if not names:
        click.echo("no limited tasks (no worker answered, and the app declares no limit())")
    for name in names:
        task = tasks.get(name, {"app": None, "workers": {}})
        declared: list[dict[str, Any]] = task["app"] or []
        several = len(declared) > 1
        specs: list[dict[str, Any] | None] = [*declared] or [None]
        for place, spec in enumerate(specs, 1):
            field = limit_id(name, place - 1)
            line = f"{name}: " + (f"#{place} " if several else "")
            line += _declared_text(spec) if spec else "no limit() in this app"
            line += f"; stored rate {stored[field]}" if field in stored else "; no stored rate"
            click.echo(line)
            for (limit, key), text in sorted(_keyed(stored).items()):
                if limit == field:
                    click.echo(f"  key {key!r}: stored rate {text}")
        if name in stored and not task["workers"] and not declared:
            click.echo("  (stored for a task nobody limits: `--reset` removes it)")
        for worker, entry in sorted(task["workers"].items()):
            for place, one in enumerate(entry.get("limits") or [entry], 1):
                in_force = one.get("override") or one.get("rate")
                how = "stored rate" if one.get("override") else "limit()"
                at = f"#{place} " if "limits" in entry else ""
                shadow = ", shadow" if one.get("shadow") else ""
                click.echo(f"  {worker}: {at}{in_force} burst {one.get('burst')} ({how}, "
                           f"{one.get('scope')}{shadow})")  # fmt: skip


def _stored_task(field: str) -> str:
    """The task a stored rate is for, from its field: ``name``, ``name#2`` (its second
    limit()) or ``["name#2", "key"]`` (one key's): never a task line of its own."""
    if field.startswith("["):
        with contextlib.suppress(ValueError, TypeError, IndexError):
            field = str(json.loads(field)[0])
    name, _, place = field.rpartition("#")
    return name if name and place.isdigit() else field


def _declared_text(spec: dict[str, Any]) -> str:
    extra = "".join(f", {k}={spec[k]}" for k in ("cost", "shadow") if k in spec)
    per_key = ", per key" if spec.get("per_key") else ""
    return f"limit({spec['rate']}, burst={spec['burst']}, scope={spec['scope']}{per_key}{extra})"


def _keyed(stored: dict[str, str]) -> dict[tuple[str, str], str]:
    """The stored rates of one key of a limit: ``{(limit id, key): text}``."""
    keyed = {}
    for field, text in stored.items():
        if field.startswith("["):
            try:
                limit, key = json.loads(field)
            except (ValueError, TypeError):
                continue
            keyed[(str(limit), str(key))] = text
    return keyed


@extras.command(cls=CeleryCommand, name="concurrency")
@click.argument("task_name")
@click.argument("n", type=int, required=False)
@click.option("--reset", is_flag=True, help="Back to the task's own concurrency(n).")
@click.pass_context
def concurrency_command(ctx: click.Context, task_name: str, n: int | None, reset: bool) -> None:
    """Change the concurrency() cap of TASK_NAME to N on every worker (within a second)."""
    from .concurrency.control import set_concurrency

    if (n is None) != reset:
        raise click.UsageError("give N (tasks at once) or --reset, not both")
    app = app_of(ctx)
    known_task(app, task_name)
    try:
        with answering_store(app):
            set_concurrency(app, task_name, None if reset else n)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="N") from None
    what = "the task's own cap" if reset else f"at most {n} at once"
    click.echo(f"{task_name}: {what}, stored; every worker applies it within a second")


@extras.command(cls=CeleryCommand, name="top")
@click.option("--refresh", type=Seconds(min=0.1, max=3600), default=1.0,
              show_default=True, help="Seconds between redraws.")  # fmt: skip
@click.option("--iterations", type=click.IntRange(min=1), default=None,
              help="Draw this many frames, then exit (1: one frame).")  # fmt: skip
@click.option("--no-clear", is_flag=True, help="Append frames instead of redrawing in place "
              "(always, when the output is not a terminal).")  # fmt: skip
@click.option("--timeout", type=Seconds(min=0.1, max=60), default=1.0,
              show_default=True, help="Seconds to wait for inspect stats at start.")  # fmt: skip
@click.pass_context
def top_command(
    ctx: click.Context, refresh: float, iterations: int | None, no_clear: bool, timeout: float
) -> None:
    """Live table of task rates, failures, waits and p95 runtime per worker and cluster-wide."""
    from .stats.monitor import top

    clear = not no_clear and sys.stdout.isatty()  # piped: no clear-screen codes
    top(app_of(ctx), refresh=refresh, iterations=iterations, clear=clear, out=sys.stdout,
        inspect_timeout=timeout)  # fmt: skip


@extras.command(cls=CeleryCommand, name="exporter")
@click.option("--port", type=click.IntRange(min=1, max=65535), default=9808,
              show_default=True, help="Port of /metrics.")  # fmt: skip
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
    try:
        serve(app_of(ctx), port, address)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise click.ClickException(f"cannot serve on {address}:{port}: {reason}") from None


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
    store = listing["store"]
    if as_json:
        click.echo(json.dumps(listing, sort_keys=True, default=str))
    else:
        _print_revoked(listing)
    if "error" in store:  # after what the workers said: exit 1, the store's part missing
        raise store_down(app_of(ctx), str(store["error"]))


def _print_revoked(listing: dict[str, Any]) -> None:
    """``extras revoked``'s text: the store's part (unless it is down), then each worker."""
    store = listing["store"]
    if "error" not in store:
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


def _tasks(count: int) -> str:
    return "task" if count == 1 else "tasks"


def purge_parked_too(ctx: click.Context, names: set[str]) -> None:
    """Run by ``celery purge`` (and ``-Q``, ``-X``) once it has emptied the broker's queues
    *names*: drop what the delay store holds for them too (else those tasks run later, as
    if the purge had missed them) and say how many, on a line after Celery's."""
    from .delay.purge import ParkedNotPurged, purge_parked, purges_parked

    app = app_of(ctx)
    if not names or not purges_parked(app):
        return
    try:
        done = purge_parked(app, names)
    except ParkedNotPurged as exc:
        raise click.ClickException(f"the queues were purged, but {exc}"[:500]) from None
    echo = ctx.obj.echo
    if done.dropped:
        echo(f"Purged {done.dropped} parked {_tasks(done.dropped)} from the delay store.")
    else:
        echo("No parked tasks purged from the delay store.")
    kept = done.purged.kept
    if kept:
        echo(f"Kept {kept} parked {_tasks(kept)} recording no queue, whose exchange and routing "
             "key may lead to a queue not purged (`celery extras delayed --drop TASK_NAME` "
             "drops a task's).")  # fmt: skip


compat.after_purge_command(
    purge_parked_too,
    note="With celery-extras installed on the app, the tasks its delay store holds for "
    "these queues (parked, or on their way to a worker) are dropped too, and counted on a "
    "line of their own; `celery extras delayed --drop TASK_NAME` drops one task's, whatever "
    "its queue.",
)


@extras.command(cls=CeleryCommand, name="delayed")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--drop", metavar="TASK_NAME", default=None, help="Drop every task of TASK_NAME "
              "the store holds (parked, or on its way to a worker), whatever its queue, and "
              "print how many; asks first, unless -f.")  # fmt: skip
@click.option("-f", "--force", is_flag=True, help="With --drop: do not ask first.")
@click.pass_context
def delayed_command(ctx: click.Context, as_json: bool, drop: str | None, force: bool) -> None:
    """List what the delay store holds: parked tasks per task name, and the next due time.

    \b
    celery -A proj extras delayed [--json]
    celery -A proj extras delayed --drop TASK_NAME [-f] [--json]

    `celery -A proj purge` (and -Q, -X) drops the parked tasks of the queues it purges.
    """
    from .delay.capability import delayed

    if force and drop is None:
        raise click.UsageError("-f/--force goes only with --drop TASK_NAME")
    if drop is not None:
        _drop_delayed(ctx, drop, force, as_json)
        return
    app = app_of(ctx)
    with answering_store(app):
        listing = delayed(app)
    if as_json:
        click.echo(json.dumps(listing, sort_keys=True))
        return
    store = listing["store"]
    risk = f", may evict {', '.join(store['at_risk'])}" if store["at_risk"] else ""
    click.echo(f"delay store: {listing['depth']} entries waiting "
               f"(maxmemory-policy {store['policy']}{risk})")  # fmt: skip
    if len(listing["shards"]) > 1:
        click.echo("  per shard: " + ", ".join(f"{n} {d}" for n, d in listing["shards"].items()))
    if store.get("parking") == "refused":
        click.echo("  nothing is parked there: set maxmemory-policy noeviction, or "
                   "extras_store_allow_eviction = True")  # fmt: skip
    if listing["uses"]:
        click.echo(f"due queues: {', '.join(listing['due_queues'])}, consumed by every worker "
                   f"beside its queue, because of {'; '.join(listing['uses'])}")  # fmt: skip
    else:
        click.echo(
            "due queues: none (no limit(), retry_policy() or coalesce(), extras_eta_store off)"
        )
    width = max((len(name) for name in listing["tasks"]), default=4)
    for name, entry in listing["tasks"].items():
        due_in = entry["next_due_in"]
        when = "-" if due_in is None else f"next due in {due_in:.1f} s"
        click.echo(f"  {name:<{width}}  {entry['parked']:>8} parked  {when}")


def _drop_delayed(ctx: click.Context, name: str, force: bool, as_json: bool) -> None:
    """``delayed --drop TASK_NAME``: refuse a name that is no task of the app and has nothing
    parked (a typo), ask unless *force*, drop, print how many."""
    from .delay.capability import delayed
    from .delay.purge import MAX_TASK_NAME, drop_delayed

    if not name.strip() or len(name) > MAX_TASK_NAME:
        raise click.BadParameter(f"{name[:40]!r}: expected a task name (1 to {MAX_TASK_NAME} "
                                 "characters)", param_hint="--drop")  # fmt: skip
    app = app_of(ctx)
    with answering_store(app):
        tasks: dict[str, Any] = delayed(app)["tasks"]
    parked = int(tasks.get(name, {}).get("parked", 0))
    if not parked and name not in app.tasks:
        raise click.ClickException(
            f"{name}: no task of this app has that name, and nothing is parked under it "
            f"(parked: {', '.join(tasks) or 'none'}){did_you_mean(app, name)}"
        )
    if parked and not force:
        click.confirm(f"This will drop {parked} parked {_tasks(parked)} of {name} from the "
                      "delay store. There is no undo. Are you sure?", abort=True)  # fmt: skip
    with answering_store(app):
        dropped = drop_delayed(app, name) if parked else 0
    if as_json:
        click.echo(json.dumps({"task": name, "dropped": dropped}))
    elif dropped:
        click.echo(f"Dropped {dropped} parked {_tasks(dropped)} of {name} from the delay store.")
    else:
        click.echo(f"No parked tasks of {name} in the delay store.")


@extras.command(cls=CeleryCommand, name="coalesce")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list.")
@click.pass_context
def coalesce_command(ctx: click.Context, as_json: bool) -> None:
    """List the coalesced keys held in the store: the run of each, and its waiting run."""
    from .coalesce.redis_holds import RedisHolds
    from .store.client import redis_client, store_key, store_url

    app = app_of(ctx)
    if store_url(app) is None:
        raise click.ClickException("no store (extras_redis_url, or a Redis broker or backend)")
    with answering_store(app):
        listing = list(RedisHolds(redis_client(app, background=True), store_key(app)).listing())
    if as_json:
        click.echo(json.dumps(listing, sort_keys=True))
        return
    held = sum(1 for one in listing if one["run"] or one["wait"])
    click.echo(f"{held} coalesced key(s) held (a run or a waiting run), "
               f"{len(listing) - held} idle (their last run kept for late messages)")  # fmt: skip
    for one in sorted(listing, key=lambda k: (str(k["task"]), str(k["key"]))):
        run, wait = one["run"] or {}, one["wait"] or {}
        running = f"running {run.get('id', '?')}" if run else "not running"
        if run and not run.get("h"):
            running += " (between attempts: retry or park)"
        waiting = f", waiting {wait.get('id', '?')}" if wait else ""
        extra = f", {one['covered']} covered" if one["covered"] else ""
        orphans = f", {one['orphans']} passed on to the next run" if one["orphans"] else ""
        click.echo(f"  {shown(one['task'])} [{shown(one['key'])}]: {running}{waiting}{extra}"
                   f"{orphans}")  # fmt: skip


def _argument(text: str) -> Any:
    """A command-line argument as JSON (``1``, ``"a"``, ``[1, 2]``), else as the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


@extras.command(cls=CeleryCommand, name="memoize")
@click.argument("task_name")
@click.argument("args", nargs=-1)
@click.option("--forget", is_flag=True, help="Forget the result kept for ARGS (each read as "
              "JSON, else as text): the next call with them runs.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def memoize_command(ctx: click.Context, task_name: str, args: tuple[str, ...], forget: bool,
                    as_json: bool) -> None:  # fmt: skip
    """List the keys a memoize() task keeps a result for (most recently used first), or
    with --forget drop the one its ARGS make."""
    from .memoize import invalidate

    app = app_of(ctx)
    known_task(app, task_name)
    values = [_argument(one) for one in args]
    try:
        with answering_store(app):
            if forget:
                done: Any = invalidate.forget(app, task_name, values)
            else:
                done = invalidate.kept(app, task_name)
    except (ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"task": task_name, "forgot" if forget else "keys": done}))
    elif forget:
        click.echo(f"{'forgot the' if done else 'no'} result kept for {task_name} "
                   f"{shown(json.dumps(values))}")  # fmt: skip
    else:
        click.echo(f"{len(done)} key(s) of {task_name} keep a result")
        for key in done:
            click.echo(f"  {shown(key)}")
