"""Fork safety (DESIGN.md, "Never freezes"; issue #33): a pool process forked while the
threads celery-extras starts are at work inherits no lock they held.

The short version of ``python -m bench forks`` (see bench/forks.py), on celery-extras
only: 5 worker starts with the mover and the sync threads busy, each probed until both
pool processes have run tasks, and 100 tasks on a ``--max-tasks-per-child=1`` worker (a
fork per task) while 100 parked ETA tasks are released and revokes are sent. No pool
process may hang, every worker must stop on SIGTERM within 15 s, and none of their
processes be left.
The workers start without the Flower plug-in of the ``dev`` extra (``bench/launch.py``:
it loads the ``idna`` codec first, and the mover's first connection then takes no import
lock while the pool forks), and their first import of ``encodings.idna`` is slowed to
0.3 s (``--slow-import``): before the fix every start hung both pool processes at their
first connection (``_ModuleLock.acquire`` under ``getaddrinfo``), where the import's own
millisecond or two beside the pool's first fork hung none of 40 starts on this machine.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bench import forks

#: s the worker's first import of encodings.idna is slowed by (see the module docstring)
SLOW = 0.3


def test_the_probe_sees_a_pool_process_that_never_runs_its_tasks(tmp_path: Path) -> None:
    """The bench's own check: a pool process stopped (SIGSTOP) as a hung one would be is
    found, so the tests below can fail."""
    with forks.Bench(False, tmp_path) as bench:
        worker = bench.start("probed")
        worker.wait_ready(60)
        children = bench.pool_processes(worker)
        assert children is not None and len(children) == 2, children
        os.kill(children[0], signal.SIGSTOP)
        try:
            assert forks.probe(bench, worker, deadline=5.0) == (2, 1, 1)
        finally:
            os.kill(children[0], signal.SIGCONT)


@pytest.mark.scenario
def test_worker_starts_leave_no_pool_process_hung(tmp_path: Path) -> None:
    (starts,) = forks.start_runs(5, (False,), logs=tmp_path, slow=SLOW, verbose=False)
    # a stop within 15 s of SIGTERM: a task handed to a pool process in the event loop's
    # last turn made it 30 s longer (celery_extras.workarounds.PoolFlushGuard)
    bad = [s for s in starts.runs if s.hung or s.ready is None or s.left or not s.clean_stop]
    assert not bad, "\n".join(map(repr, bad))
    assert all(s.processes == s.answered == 2 for s in starts.runs), starts.runs


@pytest.mark.scenario
def test_max_tasks_per_child_forks_hang_no_pool_process(tmp_path: Path) -> None:
    churn = forks.mtpc_run(False, 100, 100, logs=tmp_path, slow=SLOW, verbose=False)
    assert (churn.done, churn.hung, churn.backlog_ran) == (100, 0, 100), churn
    assert churn.clean_stop and churn.left == 0, churn
