"""The threads celery-extras starts, fork-safe by construction.

A prefork pool forks the worker's main process at any moment: at start, after
``--max-tasks-per-child`` tasks, when ``--autoscale`` grows, when a child dies. A fork
copies every lock as it is, but only the forking thread: a lock one of our threads held
then (a module being imported, a connection pool, our own) is held for ever in the
child, and the child hangs at its first use of it. So every piece of work a thread of
ours does runs inside :meth:`ForkGate.operation`, and a fork (``os.register_at_fork``)
first waits for the operations under way to end and keeps new ones from starting until
it is done. What those threads import lazily is imported before they start
(:func:`prepare_imports`).

No Celery import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["FORK_GATE", "ForkGate", "prepare_imports", "start_thread"]

logger = logging.getLogger(__name__)

#: Longest a fork waits for our threads' operations to end before it goes on (logged).
#: Operations are bounded by the store's and the broker's socket timeouts.
FORK_WAIT = 10.0


class ForkGate:
    """Keeps forks and our threads' operations apart: a fork waits for the operations
    under way and holds new ones back until it is done."""

    def __init__(self, wait: float = FORK_WAIT) -> None:
        self.wait = wait
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._busy = 0
        self._forking = False
        self._local = threading.local()
        self.forks = 0
        self.waited = 0.0  # the longest a fork waited, seconds

    @contextmanager
    def operation(self) -> Iterator[None]:
        """One piece of a thread's work (a store call, a publish, a round): no fork starts
        while it runs (a nested operation of the same thread is part of it)."""
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth == 0:
            with self._cond:
                while self._forking:
                    self._cond.wait()
                self._busy += 1
        local.depth = depth + 1
        try:
            yield
        finally:
            local.depth = depth
            if depth == 0:
                with self._cond:
                    self._busy -= 1
                    if not self._busy:
                        self._cond.notify_all()

    @contextmanager
    def idle(self) -> Iterator[None]:
        """Inside an operation, a wait on another thread (which may be the one forking): a
        fork may run meanwhile; the operation goes on after it."""
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth == 0:
            yield
            return
        with self._cond:
            self._busy -= 1
            if not self._busy:
                self._cond.notify_all()
        local.depth = 0
        try:
            yield
        finally:
            with self._cond:
                while self._forking:
                    self._cond.wait()
                self._busy += 1
            local.depth = depth

    def before_fork(self) -> None:
        """``os.fork()`` is about to run: wait for the operations under way to end."""
        if getattr(self._local, "depth", 0):  # forking from inside an operation: no wait
            return
        started = time.monotonic()
        with self._cond:
            self._forking = True
            deadline = started + self.wait
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    logger.warning(
                        "celery-extras: a fork waited %.0f s for %d operation(s) of our "
                        "threads and goes on without them",
                        self.wait, self._busy,
                    )  # fmt: skip
                    break
                self._cond.wait(left)
        self.waited = max(self.waited, time.monotonic() - started)

    def after_fork_in_parent(self) -> None:
        """The fork is done: the operations held back go on."""
        with self._cond:
            self._forking = False
            self.forks += 1
            self._cond.notify_all()

    def after_fork_in_child(self) -> None:
        """In the child no thread of ours runs: a gate of its own, with nothing under way."""
        self._reset()

    def info(self) -> dict[str, float]:
        return {"forks": self.forks, "longest_fork_wait": round(self.waited, 4)}


#: The process' one gate: every thread celery-extras starts works inside its operations.
FORK_GATE = ForkGate()

os.register_at_fork(
    before=FORK_GATE.before_fork,
    after_in_parent=FORK_GATE.after_fork_in_parent,
    after_in_child=FORK_GATE.after_fork_in_child,
)


_prepared = False


def prepare_imports() -> None:
    """Import now what our threads would otherwise import on first use, while holding that
    module's import lock: the codec a host name is resolved with (``encodings.idna``,
    imported by the first ``getaddrinfo``) and the resolver's own modules."""
    global _prepared
    if _prepared:
        return
    "localhost".encode("idna")
    with contextlib.suppress(OSError):  # no resolver here: nothing more it could import
        socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)
    _prepared = True


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread of ours, its lazy imports done first. *target* does each
    piece of its work inside ``FORK_GATE.operation()`` and waits outside it."""
    prepare_imports()
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread
