"""Real ``celery worker`` processes for tests: started, watched, and always stopped.

Each worker runs in its own session (process group), so stopping it also stops
its pool children, and :func:`stop_all` reaps any the tests left running.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["WorkerProcess", "stop_all", "wait_for"]

ROOT = Path(__file__).resolve().parents[2]
_running: list[WorkerProcess] = []


def wait_for(
    condition: Callable[[], Any],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str | Callable[[], str] = "",
) -> Any:
    """Poll *condition* until it is truthy and return its value; fail after *timeout* s,
    saying *what* was awaited (a callable: what it says then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {said or condition}")
        time.sleep(interval)


class WorkerProcess:
    """``celery -A <app> worker`` in a subprocess, logging to *log_path*."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        log_path: Path,
        *,
        app: str = "tests.support.proj",
        concurrency: int = 2,
        pool: str = "prefork",
        queues: Sequence[str] = (),
        args: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.hostname = f"{name}@{os.uname().nodename}"
        self.log_path = log_path
        self.argv = [
            sys.executable, "-m", "celery", "-A", app, "worker",
            "-n", self.hostname, "-c", str(concurrency), "-P", pool, "-l", "INFO",
            *(["-Q", ",".join(queues)] if queues else []),
            *args,
        ]  # fmt: skip
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True, timeout: float = 60.0) -> WorkerProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        _running.append(self)
        if wait:
            self.wait_ready(timeout)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def ready_count(self) -> int:
        """How many times this worker has logged ``<hostname> ready.`` (once per start)."""
        return self.log().count(f"{self.hostname} ready.")

    def wait_ready(self, timeout: float = 60.0, count: int | None = None) -> None:
        want = count if count is not None else 1

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"worker {self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}"
                )
            return self.ready_count() >= want

        wait_for(ready, timeout, what=f"worker {self.name} ready")

    @property
    def pid(self) -> int:
        assert self.proc is not None, "worker not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        """Send *signum* to the worker's whole process group (main process and pool)."""
        if self.alive():
            os.killpg(self.pid, signum)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the worker and its pool, as a crash would."""
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """Warm shutdown (SIGTERM), then SIGKILL if it has not exited in *timeout* s
        (``timeout=0``: SIGKILL at once, see :meth:`Cluster.stop`)."""
        if self.proc is None:
            return None
        try:
            if timeout > 0 and self.alive():
                self.signal(signal.SIGCONT)
                os.kill(self.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)  # pool children left behind, if any
            if self.proc.poll() is None:
                self.proc.wait(10)
            if self in _running:
                _running.remove(self)
        return self.proc.returncode


def stop_all() -> None:
    """Stop every worker still running (tests that failed half-way leave some)."""
    for worker in list(_running):
        worker.stop(timeout=5.0)


atexit.register(stop_all)
