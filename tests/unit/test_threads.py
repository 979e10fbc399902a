"""Fork safety of the threads celery-extras starts (``celery_extras/threads.py``).

A pool process forked while one of our threads holds a lock inherits it held for ever: the
first test shows the hang itself (a thread of ours importing a module when the fork comes:
the child's import of it never returns) and that the gate prevents it.
"""

from __future__ import annotations

import builtins
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_extras.threads import FORK_GATE, ForkGate

#: How long a child may take to import the module before it counts as hung.
HUNG_AFTER = 3


@pytest.fixture
def slow_module(tmp_path: Path) -> Iterator[str]:
    """The name of a module whose import takes 0.5 s and says when it has begun (so its
    import lock is held)."""
    name = f"extras_slow_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "import builtins, time\nbuiltins._extras_importing.set()\ntime.sleep(0.5)\n"
    )
    sys.path.insert(0, str(tmp_path))
    builtins._extras_importing = threading.Event()  # type: ignore[attr-defined]
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        del builtins._extras_importing  # type: ignore[attr-defined]


def fork_while_importing(name: str, gated: bool) -> int:
    """Start a thread importing *name* (inside a gate operation when *gated*), fork while it
    holds the module's import lock, and import *name* in the child: the child's exit status
    (0: imported; the signal number when it hung and was killed)."""

    def importing() -> None:
        if gated:
            with FORK_GATE.operation():
                importlib.import_module(name)
        else:
            importlib.import_module(name)

    thread = threading.Thread(target=importing, daemon=True)
    thread.start()
    assert builtins._extras_importing.wait(10)  # type: ignore[attr-defined]
    pid = os.fork()
    if pid == 0:  # the child: import it, or be killed as hung (pytest-timeout's handler off)
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(HUNG_AFTER)
            importlib.import_module(name)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    thread.join(10)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def test_a_child_forked_during_an_import_of_an_ungated_thread_hangs(slow_module: str) -> None:
    """The hazard, shown: without the gate the child never finishes the import."""
    assert fork_while_importing(slow_module, gated=False) == signal.SIGALRM


def test_a_fork_waits_for_the_operation_under_way_so_the_child_imports(slow_module: str) -> None:
    forks = FORK_GATE.forks
    assert fork_while_importing(slow_module, gated=True) == 0
    assert FORK_GATE.forks == forks + 1


def test_operations_wait_while_a_fork_is_under_way_and_go_on_after() -> None:
    gate = ForkGate(wait=30.0)
    gate.before_fork()
    entered = threading.Event()

    def work() -> None:
        with gate.operation():
            entered.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    assert not entered.wait(0.2)  # held back while the fork is under way
    gate.after_fork_in_parent()
    assert entered.wait(10)
    thread.join(10)


def test_a_wait_on_the_forking_thread_inside_an_operation_does_not_hold_the_fork() -> None:
    """An operation that waits for the thread that forks (the sync thread waits for the
    consumer's thread to merge a page) lets the fork go on: no deadlock, no 30 s wait."""
    gate = ForkGate(wait=30.0)
    waiting, merged, resumed = threading.Event(), threading.Event(), threading.Event()

    def sync_round() -> None:
        with gate.operation():
            with gate.idle():
                waiting.set()
                merged.wait(10)
            resumed.set()

    thread = threading.Thread(target=sync_round, daemon=True)
    thread.start()
    assert waiting.wait(10)
    started = time.monotonic()
    gate.before_fork()
    assert time.monotonic() - started < 5.0  # not the 30 s bound
    merged.set()
    assert not resumed.wait(0.2)  # its operation goes on only after the fork
    gate.after_fork_in_parent()
    assert resumed.wait(10)
    thread.join(10)


def test_a_fork_from_inside_an_operation_does_not_wait_for_itself() -> None:
    gate = ForkGate(wait=30.0)
    with gate.operation():
        started = time.monotonic()
        gate.before_fork()
        gate.after_fork_in_parent()
    assert time.monotonic() - started < 5.0 and gate.forks == 1


def test_the_child_starts_with_a_gate_of_its_own_and_nothing_under_way() -> None:
    gate = ForkGate(wait=30.0)
    gate.before_fork()
    gate.after_fork_in_child()
    with gate.operation():  # not held back by the parent's fork
        pass
    assert gate.forks == 0


ORDER = """
from celery import Celery
import celery_extras
app = Celery("order", broker="redis://127.0.0.1:1/0", set_as_current=False)
celery_extras.install(app, eta_store=True)
worker = app.WorkController(pool_cls="prefork", concurrency=2)
print(" ".join(step.name for step in worker.blueprint.order))
"""


@pytest.mark.parametrize("seed", range(8))
def test_the_delay_mover_starts_after_the_pool_has_forked(seed: int) -> None:
    """The worker's steps are ordered by a graph walk over sets (so by hash seed): the
    step that starts the mover thread requires the pool's, whose start forks."""
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    done = subprocess.run([sys.executable, "-c", ORDER], env=env, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    order = done.stdout.split()
    pool = order.index("celery.worker.components.Pool")
    assert order.index("celery_extras.delay.capability.DelayWorkerStep") > pool
