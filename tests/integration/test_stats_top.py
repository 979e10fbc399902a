"""``extras top`` in a real terminal (tmux, 80x24 and 200x50), and hostile names in events.

The terminal tests read tmux's screen (``capture-pane``) while top redraws: every
line fits, the header stays on the first line, the worker's rows are there. With
``EXTRAS_DOCS_SCREENSHOTS=1`` the 80x24 capture is written to ``docs/_static``.
The escape test sends ``worker-throughput`` events whose hostname and task names
carry terminal escapes: top, the exporter and the Flower page show them escaped.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Cluster
from tests.integration.test_stats import Service, free_port, http_get
from tests.support import proj
from tests.support.workers import ROOT, wait_for

STATS_TASKS = ("tests.support.tasks_stats",)
ESC = "\x1b"


class Tmux:
    """A private tmux server (its own socket) running one command in a sized window."""

    def __init__(self, name: str) -> None:
        if shutil.which("tmux") is None:
            pytest.fail("tmux is missing: .ci/run installs it with apt-get")
        self.socket = f"extras-{name}-{os.getpid()}"

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=30, check=True)  # fmt: skip
        return done.stdout

    def start(self, command: list[str], env: dict[str, str], width: int, height: int) -> None:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        shell = f"cd {shlex.quote(str(ROOT))} && env {exports} {shlex.join(command)}"
        self.tmux(
            "-f", "/dev/null", "new-session", "-d", "-x", str(width), "-y", str(height), shell
        )

    def screen(self) -> list[str]:
        return self.tmux("capture-pane", "-p").rstrip("\n").split("\n")

    def stop(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def tmux(request: pytest.FixtureRequest) -> Iterator[Tmux]:
    terminal = Tmux(request.node.name.replace("[", "-").replace("]", ""))
    try:
        yield terminal
    finally:
        terminal.stop()


def top_env(cluster: Cluster) -> dict[str, str]:
    return {
        "PYTHONPATH": str(ROOT),
        "TERM": "xterm",
        **proj.worker_env(cluster.broker, cluster.ns, cluster.conf, cluster.include),
    }


@pytest.mark.parametrize(("width", "height"), [(80, 24), (200, 50)])
def test_top_fits_the_terminal_and_keeps_its_header(
    cluster: Cluster, send: Callable[..., Any], tmux: Tmux, width: int, height: int
) -> None:
    cluster.configure(include=STATS_TASKS, extras_stats_interval=0.5)
    worker = cluster.worker("top1", concurrency=2)
    results = [send("tests.stats.succeeds", i) for i in range(6)]
    results += [send("tests.stats.fails") for _ in range(2)]
    results += [send("tests.stats.retries_exc") for _ in range(2)]
    for result in results:
        result.get(timeout=60, propagate=False)
    tmux.start([sys.executable, "-m", "celery", "-A", "tests.support.proj", "extras", "top",
                "--refresh", "0.3"], top_env(cluster), width, height)  # fmt: skip

    def drawn() -> list[str] | None:
        screen = tmux.screen()
        return screen if any(line.startswith(worker.hostname) for line in screen) else None

    screen = wait_for(drawn, timeout=60, interval=0.3, what=f"top drawn; screen: {tmux.screen()}")
    time.sleep(1.5)  # several more redraws: the header must still be on top
    for _ in range(3):
        screen = tmux.screen()
        assert len(screen) <= height, screen
        assert all(len(line) <= width for line in screen), screen
        assert screen[0].startswith("celery-extras top  1 worker(s)"), screen
        assert screen[2].startswith("task"), screen
        time.sleep(0.4)
    rows = {line.split()[0]: line.split() for line in screen if line.startswith("  ")}
    succeeds = rows.get("tests.stats.succeeds") or rows.get("tests.stats.succe~")
    assert succeeds is not None, screen
    header = screen[2].split()
    counts = dict(zip(header[header.index("|") + 1 : -1],
                      succeeds[succeeds.index("|") + 1 : -1], strict=True))  # fmt: skip
    assert counts["ok"] == "6" and counts["fail"] == "0", (counts, screen)
    retried = rows.get("tests.stats.retries_exc") or rows.get("tests.stats.retri~")
    assert retried is not None, screen
    retry = dict(zip(header[header.index("|") + 1 : -1],
                     retried[retried.index("|") + 1 : -1], strict=True))  # fmt: skip
    assert (retry["retry"], retry["ok"], retry["fail"]) == ("2", "2", "0"), (retry, screen)
    if width == 80 and os.environ.get("EXTRAS_DOCS_SCREENSHOTS") == "1":
        (ROOT / "docs" / "_static" / "top-80x24.txt").write_text("\n".join(screen) + "\n")


def send_hostile_events(cluster: Cluster, host: str, task: str) -> None:
    """Valid worker-throughput events whose names carry terminal escapes."""
    from celery_extras.stats.recorder import Recorder

    recorder = Recorder()
    for _ in range(3):
        recorder.succeeded(task, 0.01)
    time.sleep(1.1)  # the 1 s window counts completed seconds
    with cluster.app.connection_for_write() as conn:
        dispatcher = cluster.app.events.Dispatcher(conn, hostname=host, enabled=True)
        for _ in range(5):
            dispatcher.send("worker-throughput", **recorder.snapshot([1, 10, 60]))
            time.sleep(0.3)
        dispatcher.close()


def test_escape_sequences_in_events_never_reach_the_terminal_nor_the_labels(
    cluster: Cluster, tmp_path: Any
) -> None:
    host = f"evil{ESC}[2J{ESC}]0;pwned\x07@h"
    task = f"task{ESC}[31m\u202e"
    cluster.configure(include=STATS_TASKS)
    port = free_port()
    top = Service(cluster, "top", ["extras", "top", "--refresh", "0.3", "--no-clear"], {})
    exporter = Service(cluster, "exporter", ["extras", "exporter", "--port", str(port)], {})
    try:
        time.sleep(3)  # both consuming events (no event is replayed to late listeners)
        shown_host = "evil\\x1b[2J\\x1b]0;pwned\\x07@h"
        shown_task = "task\\x1b[31m\\u202e"

        def labels() -> set[tuple[str, str]]:
            text = http_get(f"http://127.0.0.1:{port}/metrics") or ""
            return {(s.labels.get("worker", ""), s.labels.get("task", ""))
                    for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip

        def everywhere() -> bool:
            send_hostile_events(cluster, host, task)
            return shown_host in top.log() and (shown_host, shown_task) in labels()

        wait_for(everywhere, timeout=60, interval=0.5, what="the hostile events shown")
        log = top.log_path.read_bytes()
        assert ESC.encode() not in log and b"\x07" not in log and "\u202e".encode() not in log
        assert shown_task in top.log()
        metrics = http_get(f"http://127.0.0.1:{port}/metrics") or ""
        assert ESC not in metrics and "\x07" not in metrics and "\u202e" not in metrics
        assert not any(ESC in w or ESC in t for w, t in labels())
        assert top.alive() and exporter.alive()
    finally:
        top.stop()
        exporter.stop()
