"""The app of :mod:`bench.green_restarts`' workers: the tests' app (:mod:`tests.support.proj`),
whose worker writes every greenlet's stack to ``greenlets-<pid>.txt`` beside the bench's
logs on ``SIGUSR2`` (py-spy sees only the hub of a frozen gevent worker)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tests.support.proj import app

__all__ = ["app"]

#: where the stacks go (the bench's folder, from its workers' environment)
FOLDER = Path(os.environ.get("BENCH_GREEN_FOLDER", "."))


def _write_greenlets() -> None:
    import gevent.util

    with open(FOLDER / f"greenlets-{os.getpid()}.txt", "a") as out:
        gevent.util.print_run_info(file=out)


if "gevent" in sys.modules:
    import gevent

    gevent.signal_handler(signal.SIGUSR2, _write_greenlets)
