"""A real Flower with the one-liner, driven by headless Chromium: the /extras page tells the truth.

Two prefork workers on their own queues, so the truth per worker and task is known.
Chromium is Debian's (``.ci/run`` installs it), driven by Playwright with
``executable_path``; Playwright's own browser download is never used. The page's
table, Flower's own pages, the worker page's "Other" tab and Flower's ``/metrics``
are all checked. With ``EXTRAS_DOCS_SCREENSHOTS=1`` the screenshots are written
to ``docs/img`` (how the docs' pictures are made).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Cluster
from tests.integration.test_stats import Service, free_port, http_get
from tests.support.brokers import PrivateRedis
from tests.support.workers import ROOT, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STATS_TASKS = ("tests.support.tasks_stats",)
DOCS_IMG = ROOT / "docs" / "img"

#: The rendered table must read exactly this (``{scope: {task: {column: text}}}``).
ROW_READ = """() => {
  const out = {};
  for (const tr of document.querySelectorAll("tr[data-task]")) {
    const scope = tr.getAttribute("data-scope"), task = tr.getAttribute("data-task");
    const cells = {};
    for (const td of tr.querySelectorAll("td[data-col]")) {
      cells[td.getAttribute("data-col")] = td.textContent.trim();
    }
    (out[scope] = out[scope] || {})[task] = cells;
  }
  return out;
}"""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium with apt-get")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, tempfile.TemporaryDirectory(dir=tmp_path) as profile:
        context = p.chromium.launch_persistent_context(
            user_data_dir=profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1500, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


#: The parts of task names (text between the breaks after dots and underscores) that the
#: page drew on more than one line.
SPLIT_READ = """() => {
  const split = [];
  document.querySelectorAll("td.extras-task").forEach((td) => {
    td.childNodes.forEach((node) => {
      if (node.nodeType !== Node.TEXT_NODE) { return; }
      const range = document.createRange();
      range.selectNodeContents(node);
      const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
      if (tops.size > 1) { split.push(node.textContent); }
    });
  });
  return split;
}"""


def shoot(page: Any, tmp_path: Path, name: str) -> Path:
    target = DOCS_IMG if os.environ.get("EXTRAS_DOCS_SCREENSHOTS") == "1" else tmp_path
    path = target / name
    page.screenshot(path=str(path), full_page=True)
    return path


#: Each table's line under its title (``{scope: text}``): a worker's age and gauges.
META_READ = """() => {
  const out = {};
  for (const section of document.querySelectorAll("section[data-scope]")) {
    const meta = section.querySelector(".extras-worker-meta");
    if (meta) { out[section.getAttribute("data-scope")] = meta.textContent; }
  }
  return out;
}"""


def samples(text: str | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, parsed by prometheus_client: ``{(name, labels): value}``."""
    found = {}
    for family in text_string_to_metric_families(text or ""):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_flower_page_shows_each_worker_and_task_exactly(
    cluster: Cluster,
    send: Callable[..., Any],
    browser: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # the store on a Redis that may evict it: the page says so on each worker's line
    (tmp_path / "store").mkdir()
    store = PrivateRedis(tmp_path / "store", "--maxmemory-policy", "allkeys-lru").start()
    request.addfinalizer(store.stop)
    cluster.configure(include=STATS_TASKS, extras_stats_interval=0.5,
                      extras_stats_windows=[1, 10, 600], extras_redis_url=store.url)  # fmt: skip
    a = cluster.worker("flower-a", concurrency=2, queues=[cluster.ns])
    b = cluster.worker("flower-b", concurrency=2, queues=[f"{cluster.ns}.b"])
    results = [send("tests.stats.succeeds", i) for i in range(5)]
    results += [send("tests.stats.fails") for _ in range(2)]
    results += [send("tests.stats.succeeds", i, queue=f"{cluster.ns}.b") for i in range(3)]
    results += [send("tests.stats.retries_exc", queue=f"{cluster.ns}.b") for _ in range(2)]
    for result in results:
        result.get(timeout=60, propagate=False)

    port = free_port()
    flowerconfig = tmp_path / "flowerconfig.py"
    flowerconfig.write_text("from celery_extras.flower import in_flower; in_flower()\n")
    flower = Service(
        cluster, "flower",
        ["flower", f"--port={port}", "--address=127.0.0.1", f"--conf={flowerconfig}"], {},
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_get(f"{base}/healthcheck") is not None, timeout=60,
                 what=f"flower up; log: {flower.log()[-2000:]}")  # fmt: skip
        page = browser.new_page()
        response = page.goto(f"{base}/extras")
        assert response is not None and response.status == 200

        truth = {
            a.hostname: {
                "tests.stats.succeeds": {"received": "5", "succeeded": "5", "failed": "0"},
                "tests.stats.fails": {"received": "2", "succeeded": "0", "failed": "2"},
            },
            b.hostname: {
                "tests.stats.succeeds": {"received": "3", "succeeded": "3", "failed": "0"},
                "tests.stats.retries_exc": dict(
                    received="4", succeeded="2", failed="0", retried="2"
                ),
            },
            "cluster": {
                "tests.stats.succeeds": {"received": "8", "succeeded": "8", "failed": "0"},
                "tests.stats.fails": {"failed": "2", "retried": "0"},
                "tests.stats.retries_exc": {"retried": "2", "succeeded": "2", "failed": "0"},
            },
        }

        def table() -> dict[str, Any]:
            rows: dict[str, Any] = page.evaluate(ROW_READ)
            return rows

        def shows_truth() -> bool:
            rows = table()
            return all(
                {k: rows.get(scope, {}).get(task, {}).get(k) for k in cells} == cells
                for scope, tasks in truth.items()
                for task, cells in tasks.items()
            )

        wait_for(shows_truth, timeout=60, interval=0.5,
                 what=f"the page's table equal to the truth; last: {table()}")  # fmt: skip
        rows = table()
        assert set(rows) == {"cluster", a.hostname, b.hostname}
        assert set(rows[a.hostname]) == {"tests.stats.succeeds", "tests.stats.fails"}
        assert set(rows[b.hostname]) == {"tests.stats.succeeds", "tests.stats.retries_exc"}
        for scope in rows.values():
            for cells in scope.values():
                assert set(cells) >= {"rate_1s", "rate_10s", "rate_10m", "rate_limited",
                                      "p50_ms", "p95_ms", "chart"}  # fmt: skip
        p95 = float(rows[a.hostname]["tests.stats.succeeds"]["p95_ms"])
        assert 0 < p95 < 10_000
        assert rows[a.hostname]["tests.stats.fails"]["p95_ms"] == "—"  # nothing succeeded

        # live: the page renders again as events arrive, and the charts get drawn
        seen = int(page.get_attribute("body", "data-extras-events") or 0)
        wait_for(lambda: int(page.get_attribute("body", "data-extras-events") or 0) >= seen + 4,
                 timeout=30, what="the page following the events")  # fmt: skip
        wait_for(lambda: page.locator("#extras-chart-minute path").count() == 2, timeout=30,
                 what="the last-minute chart drawn")  # fmt: skip

        # at 1280 px a task name wraps only after its dots and underscores, never mid-word
        page.set_viewport_size({"width": 1280, "height": 1000})
        split: list[str] = page.evaluate(SPLIT_READ)
        assert split == [], f"task names wrapped mid-word: {split}"
        shoot(page, tmp_path, "flower-extras-1280.png")

        # each worker's line: its gauges (from the gauge table) as /extras/data gives them
        def worker_lines() -> dict[str, list[str]] | None:
            meta: dict[str, str] = page.evaluate(META_READ)
            body = http_get(f"{base}/extras/data")
            data = json.loads(body) if body else {"workers": {}}
            lines = {host: meta.get(host, "").split(" \u00b7 ") for host in (a.hostname,
                     b.hostname)}  # fmt: skip
            same = all(
                lines[host][0].startswith("last event ")
                and lines[host][1:] == data["workers"].get(host, {}).get("gauges")
                for host in lines
            )
            return lines if same else None

        lines = wait_for(worker_lines, timeout=30, interval=0.5,
                         what="each worker's line equal to its gauges")  # fmt: skip
        for host in (a.hostname, b.hostname):
            assert any(part.startswith("store: ") for part in lines[host]), lines[host]
            assert (
                "store may evict parked tasks, revokes, limit and cap overrides, retry "
                "failure memory, concurrency slot holds, coalescing holds (maxmemory-policy "
                "allkeys-lru)" in lines[host]
            ), lines[host]

        # the queue table: what the delay store holds per queue (nothing here), issue 54
        parked = page.locator(f'tr[data-queue="{cluster.ns}"] td[data-col="parked"]')
        wait_for(lambda: parked.count() == 1 and parked.inner_text().strip() == "0",
                 timeout=30, what="the queue table's parked column")  # fmt: skip

        # in Flower's navigation, marked active on its page
        link = page.locator("a.nav-link", has_text="Extras")
        assert link.count() == 1 and link.get_attribute("href") == "/extras"
        assert "active" in (link.get_attribute("class") or "")
        shot = shoot(page, tmp_path, "flower-extras.png")
        assert shot.stat().st_size > 10_000

        # Flower's own pages still work, and link to the page
        for path in ("/", "/workers", "/tasks", "/broker", f"/worker/{a.hostname}"):
            response = page.goto(f"{base}{path}")
            assert response is not None and response.status == 200, path
            assert page.locator("a.nav-link", has_text="Extras").count() == 1, path
        # the worker page's Other tab: short figures, no nested repr
        page.click("#worker-tab-other")
        page.wait_for_selector("#tab-other.show", state="visible")
        page.wait_for_timeout(400)  # Bootstrap's fade, for the screenshot only
        other = page.locator("#tab-other").inner_text()
        assert "{'windows'" not in other and "{'" not in other, other
        assert "tests.stats.succeeds: " in other and "succeeded 5" in other, other
        shoot(page, tmp_path, "flower-worker-other.png")

        # Prometheus families on Flower's /metrics, parsed by prometheus_client
        scrape = samples(http_get(f"{base}/metrics"))
        for worker, task, state, n in (
            (a.hostname, "tests.stats.succeeds", "succeeded", 5),
            (a.hostname, "tests.stats.fails", "failed", 2),
            (b.hostname, "tests.stats.retries_exc", "retried", 2),
            (b.hostname, "tests.stats.retries_exc", "failed", 0),
        ):
            labels = tuple(sorted({"worker": worker, "task": task, "state": state}.items()))
            assert scrape[("celery_extras_tasks_total", labels)] == n, (worker, task, state)
        count = ("celery_extras_task_runtime_seconds_count",
                 (("task", "tests.stats.succeeds"), ("worker", b.hostname)))  # fmt: skip
        assert scrape[count] == 3
        for worker in (a.hostname, b.hostname):  # six kinds of data the store may evict
            labels = (("policy", "allkeys-lru"), ("worker", worker))
            assert scrape[("celery_extras_store_evictable", labels)] == 6
        for queue in (cluster.ns, f"{cluster.ns}.b"):  # the delay store's counts, per queue
            assert scrape[("celery_extras_queue_parked", (("queue", queue),))] == 0, queue
        assert flower.alive(), flower.log()[-3000:]
    finally:
        flower.stop()
