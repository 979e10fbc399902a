"""The users' pytest plugin (issue 26), run as a user runs it: pytest on test files copied
out of the repository, with module-level tasks, the four fixtures and in-process workers.

The files are the ones the docs page "Testing your tasks" shows (``docs/examples``) and a
twenty-workers file (``tests/support/plugin_user``). Their wall times are printed by
``python -m bench testing``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import redis

from tests.support.workers import ROOT

EXAMPLES = sorted((ROOT / "docs" / "examples").glob("test_*.py"))
MANY_WORKERS = ROOT / "tests" / "support" / "plugin_user" / "many_workers.py"
#: A database of the shared Redis no other test uses: ``--extras-redis-url`` under xdist.
SHARED_URL = "redis://127.0.0.1:6379/13"


def user_pytest(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in *workdir* (outside the repository), as a user's project runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def copied(tmp_path: Path, *files: Path, name: str | None = None) -> Path:
    for file in files:
        shutil.copy(file, tmp_path / (name or file.name))
    return tmp_path


def passed(run: subprocess.CompletedProcess[str]) -> int:
    found = re.search(r"(\d+) passed", run.stdout)
    return int(found.group(1)) if found else 0


def test_the_documented_examples_pass_outside_the_repository(tmp_path: Path) -> None:
    """A 1/s limit over 30 tasks, retries at 2, 4 and 8 s, a coalesced key, a cap of two,
    a parked ETA task, a batch due after its wait; celery_config, the celery mark, tasks
    defined in a test."""
    run = user_pytest(copied(tmp_path, *EXAMPLES))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert passed(run) == 9, run.stdout[-2000:]
    assert "warning" not in run.stdout.lower(), run.stdout[-2000:]


def test_twenty_workers_one_after_another_leave_no_thread_no_connection_nor_logging_changed(
    tmp_path: Path,
) -> None:
    run = user_pytest(copied(tmp_path, MANY_WORKERS, name="test_many_workers.py"))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert passed(run) == 22  # and a test after them hears warnings as before


def test_under_xdist_each_process_has_a_namespace_of_its_own_on_one_redis(
    tmp_path: Path,
) -> None:
    """Two processes share the Redis given with ``--extras-redis-url`` (store and broker);
    each test's keys are under its own namespace, and gone after it."""
    client = redis.Redis.from_url(SHARED_URL)
    client.flushdb()
    try:
        run = user_pytest(copied(tmp_path, *EXAMPLES), "-n", "2", "--extras-redis-url",
                          SHARED_URL)  # fmt: skip
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        assert passed(run) == 9  # the documented examples (a batch's since issue 36)
        assert client.keys("*extras-test-*") == []
    finally:
        client.flushdb()
        client.close()


def test_eager_mode_warns_once_per_task_with_policies(tmp_path: Path) -> None:
    """``task_always_eager`` runs a task in the caller, where limits, caps, coalescing and
    retry waits do not apply: said once per task rather than found out."""
    (tmp_path / "test_eager.py").write_text(
        "import pytest\n"
        "from celery import shared_task\n"
        "from celery_extras import ExponentialBackoff, limit, retry_policy\n"
        "from celery_extras.admission.eager import EagerPolicyWarning\n\n"
        "CALLS = []\n\n"
        "@limit('1/s')\n@shared_task\ndef ping(i):\n    return i\n\n"
        "@retry_policy(on=(ConnectionError,), policy=ExponentialBackoff(2.0, 60.0))\n"
        "@shared_task\ndef fetch(url):\n    CALLS.append(url)\n    raise ConnectionError(url)\n\n"
        "@pytest.mark.celery(task_always_eager=True)\n"
        "def test_eager(extras_app):\n"
        "    with pytest.warns(EagerPolicyWarning, match='ping ran eagerly.*limit'):\n"
        "        assert ping.delay(1).get() == 1\n"
        "    assert [ping.delay(i).get() for i in range(5)] == list(range(5))  # no limit\n"
        "    with pytest.warns(EagerPolicyWarning, match='fetch ran eagerly.*retry_policy'):\n"
        "        result = fetch.delay('u')\n"
        "    assert result.state == 'FAILURE' and CALLS == ['u']  # no retry, no recursion\n"
        "    with pytest.raises(ConnectionError):\n"
        "        result.get()\n"
    )
    run = user_pytest(tmp_path, "-W", "error::UserWarning")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert passed(run) == 1
