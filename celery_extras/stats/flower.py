"""celery-extras inside Flower: a page at ``/extras``, the Prometheus families on ``/metrics``.

One line in ``flowerconfig.py``, run as ``celery -A proj flower --conf=flowerconfig.py``::

    from celery_extras.flower import in_flower; in_flower()

(:mod:`celery_extras.flower` re-exports this module's public names.)

Flower executes its configuration file before it builds its Tornado application,
so :func:`in_flower` can:

* start a listener on the app's ``worker-throughput`` events (a thread, as
  ``extras top`` and the exporter have) into a :class:`LiveState`, which also keeps
  a short history of cluster-wide running totals for the page's charts;
* register the Prometheus collector in the default registry, which Flower's own
  ``/metrics`` serves;
* add two handlers to Flower's URL table, ``/extras`` (the page, in Flower's
  templates and styles, behind Flower's own authentication) and ``/extras/data``
  (its JSON, polled by the page every second);
* give Flower a template loader that adds an "Extras" item to its navigation bar
  and renders the worker page's "Other" tab with :func:`readable` (short rounded
  figures instead of nested reprs).

What a worker's line on the page says of its gauges, and the cluster's waiting and
parked tasks, come from :data:`.gauges.GAUGES`: :func:`page_data` sends the texts,
the page's script only shows them.

Flower is not a dependency of celery-extras: this module imports it only in
:func:`in_flower`. A Flower whose templates lack the spots patched here still
works; the link or the readable tab is then missing, and a warning says so.
"""

from __future__ import annotations

import logging
import threading
import time
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import Celery

from . import gauges
from .listener import DONE, LiveState
from .schema import TaskFigures, merge_workers
from .text import printable, window_label

if TYPE_CHECKING:
    from .prometheus import FlowerMetrics

__all__ = ["LiveState", "in_flower", "page_data", "readable"]

logger = logging.getLogger(__name__)

_TEMPLATE = Path(__file__).with_name("templates") / "extras.html"
#: Counts shown per task, over one window.
SHOWN = ("received", "succeeded", "failed", "retried", "rejected", "revoked", "rate_limited",
         "parked", "coalesced", "shadow_limited", "batched", "debounced",
         "memoized")  # fmt: skip


def _rates(
    samples: list[tuple[float, dict[str, tuple[int, int]]]], task: str | None, step: float
) -> list[list[float]]:
    """``[[time, finished/s, failed/s], ...]`` between samples at least *step* s apart."""
    points: list[list[float]] = []
    previous: tuple[float, tuple[int, int]] | None = None
    for when, sums in samples:
        if task is None:
            value = (sum(v[0] for v in sums.values()), sum(v[1] for v in sums.values()))
        else:
            value = sums.get(task, (0, 0))
        if previous is not None:
            span = when - previous[0]
            if span < step:
                continue
            done = max(0, value[0] - previous[1][0]) / span
            failed = max(0, value[1] - previous[1][1]) / span
            points.append([round(when, 3), round(done, 3), round(failed, 3)])
        previous = (when, value)
    return points


def _shown_window(windows: tuple[float, ...]) -> float:
    return 60 if 60 in windows else max(windows)


def _row(task: TaskFigures, windows: tuple[float, ...], p95_max: bool = False) -> dict[str, Any]:
    col = windows.index(_shown_window(windows))
    done = [sum(task.counts[c][i] for c in DONE) for i in range(len(windows))]
    row: dict[str, Any] = {
        "rates": [round(n / w, 2) for n, w in zip(done, windows, strict=True)],
        **{c: task.counts[c][col] for c in SHOWN},
        "p50_ms": _ms(task.runtime.get("p50")),
        "p95_ms": _ms(task.runtime.get("p95")),
    }
    if p95_max:
        row["p95_is_max"] = True
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else float(f"{seconds * 1000:.3g}")


def _gauge_texts(state: dict[str, Any]) -> list[str]:
    """What a worker's line says of its gauges, in :data:`.gauges.GAUGES` order."""
    texts = []
    for gauge in gauges.GAUGES:
        value = state.get(gauge.key)
        text = gauge.page(value) if value is not None and gauge.page is not None else None
        if text:
            texts.append(text)
    return texts


def page_data(state: LiveState, max_age: float = 60.0) -> dict[str, Any]:
    """What ``/extras/data`` answers: the table and the charts, names made printable."""
    latest = state.latest(max_age)
    now = state.clock()
    workers = {host: figures for host, (figures, _) in latest.items()}
    windows = next(iter(workers.values())).windows if workers else (1, 10, 60, 3600)
    samples = state.samples()
    minute = [s for s in samples if s[0] >= now - 61]
    cluster_tasks = merge_workers(workers, windows)
    cluster_state = {  # the gauges that have a cluster-wide value, 0 when no worker has them
        g.key: g.merge([f.state[g.key] for f in workers.values() if g.key in f.state])
        for g in gauges.GAUGES
        if g.merge is not None
    }
    cluster_state["queues"] = {printable(q): e for q, e in cluster_state["queues"].items()}
    rows: dict[str, Any] = {}
    for host, (figures, seen) in latest.items():
        rows[printable(host)] = {
            "age": round(now - seen, 1),
            "same_windows": figures.windows == windows,
            "gauges": _gauge_texts(figures.state),
            "tasks": {
                printable(n): _row(t, figures.windows)
                for n, t in sorted(figures.tasks.items())
                if any(any(r) for r in t.counts.values())
            },
        }
    return {
        "now": now,
        "events": state.received,
        "malformed": state.malformed,
        "windows": list(windows),
        "shown_window": _shown_window(windows),
        "cluster": {
            "state": cluster_state,
            "tasks": {
                printable(n): _row(t, windows, p95_max=len(workers) > 1)
                for n, t in sorted(cluster_tasks.items())
                if any(any(r) for r in t.counts.values())
            },
        },
        "workers": rows,
        "charts": {
            "minute": _rates(minute, None, 1.0),
            "hour": _rates(samples, None, 60.0),
            "tasks": {printable(n): _rates(minute, n, 1.0) for n in sorted(cluster_tasks)},
        },
    }


# --- the worker page's "Other" tab ------------------------------------------------------


def _short(value: Any, depth: int = 0) -> str:
    """*value* as a short string: floats to 3 significant digits, dicts one level deep."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if value > 1e9:  # an epoch timestamp
            return f"{max(0.0, time.time() - value):.0f} s ago"
        return f"{value:.3g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return printable(value)[:200]
    if isinstance(value, list | tuple):
        items = [_short(v, depth + 1) for v in value[:20]]
        return "[" + ", ".join(items) + (", ..." if len(value) > 20 else "") + "]"
    if isinstance(value, dict):
        if depth >= 3:
            return f"({len(value)} entries)"
        items = [f"{printable(str(k))[:80]}: {_short(v, depth + 1)}" for k, v in
                 list(value.items())[:30]]  # fmt: skip
        more = f", ... ({len(value)} in all)" if len(value) > 30 else ""
        return ("{" if depth else "") + ", ".join(items) + more + ("}" if depth else "")
    return printable(repr(value))[:200]


def _throughput_lines(figures: Any) -> list[str]:
    windows = figures.get("windows")
    tasks = figures.get("tasks")
    if not isinstance(windows, list) or not windows or not isinstance(tasks, dict):
        return [_short(figures)]
    shown = 60 if 60 in windows else max(windows)
    col = windows.index(shown)
    lines = []
    for name, task in sorted(tasks.items()):
        if not isinstance(task, dict):
            continue
        try:
            done = sum(task.get(c, [0] * len(windows))[col] for c in DONE)
            parts = [f"{done / shown:.3g}/s over {window_label(shown)}"]
            for counter in SHOWN:
                n = task.get(counter, [0] * len(windows))[col]
                if n:
                    parts.append(f"{counter.replace('_', ' ')} {n}")
            p95 = (task.get("runtime") or {}).get("p95")
            if p95 is not None:
                parts.append(f"p95 {p95 * 1000:.3g} ms")
        except (TypeError, IndexError, ValueError):
            parts = ["(unreadable)"]
        lines.append(f"{printable(str(name))[:120]}: " + ", ".join(parts))
    return lines or ["no tasks yet"]


def readable(name: str, value: Any) -> str:
    """HTML (escaped) for one row of the worker page's "Other" tab."""
    if name == "extras" and isinstance(value, dict):
        lines = _throughput_lines(value)
    elif isinstance(value, dict):
        lines = [f"{printable(str(k))[:80]}: {_short(v, 1)}" for k, v in value.items()]
    else:
        lines = [_short(value)]
    return "<br>".join(escape(line) for line in lines)


# --- wiring into Flower -----------------------------------------------------------------


#: What :func:`in_flower` set up in this process, with the page (``None``: not yet).
_installed: FlowerMetrics | None = None
_page_added = False
_lock = threading.Lock()

_NAV_ITEM = (
    '\n<li class="nav-item"><a class="nav-link{% if active_tab == \'extras\' %} active{% end %}"'
    " href=\"{{ reverse_url('extras') }}\""
    " {% if active_tab == 'extras' %}aria-current=\"page\"{% end %}>Extras</a></li>"
)
_OTHER_CELL = "{{ humanize(value, type='duration') if name == 'uptime' else value }}"
_OTHER_READABLE = (
    "{% if name == 'uptime' %}{{ humanize(value, type='duration') }}"
    "{% else %}{% raw extras_readable(name, value) %}{% end %}"
)


def _patch_navbar(text: str) -> str:
    anchor = text.find(">Broker</a>")
    end = text.find("</li>", anchor) if anchor >= 0 else -1
    if end < 0:
        logger.warning("celery-extras: this Flower's navbar has no Broker item; no Extras link")
        return text
    end += len("</li>")
    return text[:end] + _NAV_ITEM + text[end:]


def _patch_worker(text: str) -> str:
    if _OTHER_CELL not in text:
        logger.warning("celery-extras: this Flower's worker page differs; its Other tab is as is")
        return text
    return text.replace(_OTHER_CELL, _OTHER_READABLE)


def _loader_class() -> type:
    from tornado.template import Loader, Template

    class ExtrasLoader(Loader):
        """Flower's templates, with the Extras link and the readable Other tab, plus ours."""

        def _create_template(self, name: str) -> Template:
            path = _TEMPLATE if name == "extras.html" else Path(self.root) / name
            text = path.read_text(encoding="utf-8")
            if name == "navbar.html":
                text = _patch_navbar(text)
            elif name == "worker.html":
                text = _patch_worker(text)
            return Template(text, name=name, loader=self)

    return ExtrasLoader


def _handler_classes(extras: FlowerMetrics) -> list[Any]:
    from flower.views import BaseHandler
    from tornado import web

    class ExtrasView(BaseHandler):
        @web.authenticated
        def get(self) -> None:
            self.render("extras.html")

    class ExtrasData(BaseHandler):
        @web.authenticated
        def get(self) -> None:
            self.set_header("Cache-Control", "no-store")
            self.write(page_data(extras.state))

    return [web.url(r"/extras", ExtrasView, name="extras"), (r"/extras/data", ExtrasData)]


def _add_page(extras: FlowerMetrics) -> None:
    from flower import urls

    handlers: list[Any] = urls.handlers
    catch_all = next(
        (i for i, h in enumerate(handlers) if isinstance(h, tuple) and h[0] == r".*"),
        len(handlers),
    )
    handlers[catch_all:catch_all] = _handler_classes(extras)
    urls.settings["template_loader"] = _loader_class()(
        urls.settings["template_path"], namespace={"extras_readable": readable}
    )


def in_flower(app: Celery | None = None, page: bool = True) -> FlowerMetrics:
    """For ``flowerconfig.py``: the ``/extras`` page (unless *page* is false) and the metrics.

    Idempotent: a second call returns what the first set up. The metrics are
    :func:`.prometheus.flower_metrics`' (``prometheus-client``, an extra, is
    imported only here).
    """
    global _installed, _page_added
    from .prometheus import flower_metrics

    with _lock:
        if _installed is None:
            _installed = flower_metrics(app)
        if page and not _page_added:
            _add_page(_installed)
            _page_added = True
        return _installed
