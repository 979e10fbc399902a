"""Run Celery's own integration suite on Redis, plain and with celery-extras, side by side.

    python -m tests.celery_suite.run [--plain | --with-extras | --with-policies | --both |
                                      --canvas-policies] [--tests PATH] [-- PYTEST ARGS]
    python -m tests.celery_suite.run --compare-only

Downloads the sdist of the installed Celery version from PyPI (``pip download``) into
``.celery-suite/sdist/``, extracts its ``t/`` and ``pyproject.toml`` (Celery's own pytest
settings) once into ``.celery-suite/celery-<version>/`` and runs ``pytest t/integration``
from there, the suite unchanged, with Redis as broker and result backend
(``TEST_BROKER``/``TEST_BACKEND``, read by ``t/integration/conftest.py``). The
``with-extras`` run adds ``-p tests.celery_suite.install_extras``, which calls
``celery_extras.install(app)`` on every Celery app the suite creates; the
``with-policies`` run also stacks a generous global ``limit()``, a large
``concurrency()`` and a per-message ``coalesce()`` on every task of
``t/integration/tasks.py`` (``EXTRAS_SUITE_POLICIES=1``, read by the plugin), so the
policies' gates see every message without making one wait or cover another
(``--canvas-policies`` runs ``t/integration/test_canvas.py`` plain and in that mode).
``--tests`` picks what of ``t/`` to run (``t/integration`` by default). Each mode has its
own Redis databases, flushed before it runs (the suite's ``get_redis_connection`` always
uses database 0 of the same Redis, and its pub/sub checks see the whole server: run it
while nothing else uses that Redis).

Junit XML, the full log and a JSON record of each run go to ``.celery-suite/results/``
(``plain.*``, ``with-extras.*``, ``with-policies.*``); the comparison of each mode with
the plain run is printed and saved as ``summary.txt``. A mode not run this time is
compared from its last saved results.

Exit status: 0 when every run has the same outcome as the plain one for every test, 1 when
they differ, 2 when a run produced no results (or the plugin was not in effect), or when
only one mode has results.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import version as distribution_version
from pathlib import Path
from types import FrameType
from typing import IO, Any

import psutil  # type: ignore[import-untyped]
import redis

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".celery-suite"
RESULTS = CACHE / "results"
PLUGIN = "tests.celery_suite.install_extras"
PLUGIN_LINE = re.compile(r"celery_extras\.install\(app\) ran on (\d+) Celery apps")
POLICED_LINE = re.compile(r"policies stacked on (\d+) tasks")

#: mode -> (broker db, result backend db); databases 0 and 1 belong to this project's tests
MODES: dict[str, tuple[int, int]] = {
    "plain": (11, 12),
    "with-extras": (13, 14),
    "with-policies": (9, 10),
}
#: The modes compared with the plain run, in this order.
OTHERS = ("with-extras", "with-policies")
#: What ``--canvas-policies`` runs.
CANVAS_TESTS = "t/integration/test_canvas.py"

#: Environment variables that would change what the suite's apps connect to or load
#: (``CELERY_BROKER_URL`` wins over an app's ``broker_url``, for one).
_DROPPED_ENV = ("DJANGO_SETTINGS_MODULE", "NO_WORKER", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")

PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Outcome:
    status: str  # passed, failed, error, skipped, xfailed, xpassed; "+teardown-error" too
    message: str  # first line of the failure / error / skip message ("" when passed)
    teardown: str = ""  # first line of the teardown error, if any


#: The teardown check of ``t/integration/conftest.py`` that a worker consumes the ``celery``
#: queue only: a worker whose app parks (a ``limit()``, a ``coalesce()``) consumes its due
#: queue beside it, by design (see docs/delay.rst). In the ``with-policies`` run that
#: teardown error is counted apart, not as an outcome of the test.
DUE_QUEUE_RERUN = "must only use the shared celery queue"
DUE_QUEUE_CHECK = re.compile(
    r"Integration session app must only use the shared celery queue; "
    r"found \['celery', 'celery\.extras-due'\]"
)


@dataclass
class Run:
    mode: str
    outcomes: dict[str, Outcome]
    record: dict[str, Any]
    reruns: Counter[str]


class Interrupted(Exception):
    """SIGTERM or SIGHUP: unwind, so that every process started is stopped."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


# --- the suite ------------------------------------------------------------------------------


def celery_version() -> str:
    return distribution_version("celery")


def suite_tree(version: str) -> Path:
    """``.celery-suite/celery-<version>/`` holding Celery's ``t/`` and pytest settings."""
    tree = CACHE / f"celery-{version}"
    if (tree / ".extracted").exists():
        return tree
    sdist = _download_sdist(version)
    staging = CACHE / f".celery-{version}.partial"
    _remove_tree(staging)
    staging.mkdir(parents=True)
    prefix = f"celery-{version}/"
    with tarfile.open(sdist) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.name.startswith(prefix + "t/") or m.name == prefix + "pyproject.toml"
        ]
        if not any(m.name.startswith(prefix + "t/integration/") for m in members):
            raise SystemExit(f"{sdist.name} has no t/integration/")
        for member in members:
            member.name = member.name[len(prefix) :]
        tar.extractall(staging, members=members, filter="data")
    (staging / ".extracted").write_text(f"{sdist.name}\n")
    _remove_tree(tree)
    staging.rename(tree)
    return tree


def _download_sdist(version: str) -> Path:
    directory = CACHE / "sdist"
    sdist = directory / f"celery-{version}.tar.gz"
    if not sdist.exists():
        directory.mkdir(parents=True, exist_ok=True)
        print(f"downloading the sdist of celery=={version} ...", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                f"celery=={version}",
                "-d",
                str(directory),
            ],
            check=True,
        )
    if not sdist.exists():
        raise SystemExit(f"pip download did not leave {sdist}")
    return sdist


def _remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


# --- running it -----------------------------------------------------------------------------


def suite_env(redis_url: str, mode: str) -> dict[str, str]:
    broker_db, backend_db = MODES[mode]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CELERY_") and k not in _DROPPED_ENV
    }
    host, port = _host_port(redis_url)
    if mode == "with-policies":
        env["EXTRAS_SUITE_POLICIES"] = "1"  # read by the plugin (install_extras)
    env.update(
        TEST_BROKER=f"{redis_url}/{broker_db}",
        TEST_BACKEND=f"{redis_url}/{backend_db}",
        REDIS_HOST=host,  # t/integration/tasks.py: get_redis_connection()
        REDIS_PORT=str(port),
        # tests run `celery ...` by name: this venv's, and this checkout for the plugin
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p),
        PYTHONUNBUFFERED="1",
    )
    return env


def _host_port(redis_url: str) -> tuple[str, int]:
    match = re.fullmatch(r"redis://([^:/]+)(?::(\d+))?", redis_url)
    if not match:
        raise SystemExit(f"--redis must look like redis://HOST:PORT, not {redis_url!r}")
    return match[1], int(match[2] or 6379)


def flush(redis_url: str, mode: str) -> None:
    for db in MODES[mode]:
        client = redis.Redis.from_url(f"{redis_url}/{db}")
        try:
            client.flushdb()
        finally:
            client.close()


def run_mode(
    mode: str,
    tree: Path,
    results: Path,
    redis_url: str,
    timeout: int,
    max_minutes: float,
    extra: Sequence[str],
    tests: str = "t/integration",
) -> dict[str, Any]:
    results.mkdir(parents=True, exist_ok=True)
    xml, log = results / f"{mode}.xml", results / f"{mode}.log"
    xml.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        tests,
        "-p",
        "celery.contrib.pytest",  # registers the `celery` marker, as pytest-celery does in CI
        *(["-p", PLUGIN] if mode != "plain" else []),
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        "-o",
        "junit_family=xunit1",  # has the file of each test, to name it by its node id
        f"--timeout={timeout}",
        "--timeout-method=signal",
        "-v",
        "-rfE",
        "--rerun-show-tracebacks",  # why @flaky tests were rerun, which -rfE does not show
        # the due queue's teardown error (see DUE_QUEUE_CHECK) is not a flake: no rerun
        *(["--rerun-except", DUE_QUEUE_RERUN] if mode == "with-policies" else []),
        *extra,
    ]
    flush(redis_url, mode)
    env = suite_env(redis_url, mode)
    broker_db, backend_db = MODES[mode]
    header = (
        f"== {mode}: celery {celery_version()}, broker db {broker_db}, backend db {backend_db}\n"
        f"== cwd {tree}\n== {' '.join(cmd)}\n"
    )
    code = _git_state()  # as the run starts: pytest imports celery_extras then
    started = time.time()
    returncode: int | None = None
    with open(log, "w", encoding="utf-8") as out:
        out.write(header)
        print(header, end="", flush=True)
        with _started(cmd, tree, env) as proc:
            assert proc.stdout is not None
            reader = threading.Thread(target=_copy, args=(proc.stdout, out), daemon=True)
            reader.start()
            returncode = _wait(proc, started + max_minutes * 60, out)
        reader.join(timeout=30)  # the pipe ends once every process that holds it is gone
    duration = time.time() - started
    text = log.read_text(encoding="utf-8", errors="replace")
    plugin = PLUGIN_LINE.findall(text)
    policed = POLICED_LINE.findall(text)
    record = {
        "mode": mode,
        "celery": celery_version(),
        "command": cmd,
        "cwd": str(tree),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "duration_s": round(duration, 1),
        "returncode": returncode,
        "summary": _summary_line(text),
        "installed_on_apps": int(plugin[-1]) if plugin else None,
        "policed_tasks": int(policed[-1]) if policed else None,
        "tests": tests,
        "git": code,
        "junitxml": str(xml),
        "log": str(log),
    }
    (results / f"{mode}.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


@contextlib.contextmanager
def _started(cmd: Sequence[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """Start *cmd* in its own process group; on leaving, stop it and everything it started."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        _stop_all(proc)


def _copy(stream: IO[str], out: IO[str]) -> None:
    """Copy the output of pytest to *out* and to stdout, line by line, until it ends."""
    for line in stream:
        out.write(line)
        out.flush()
        sys.stdout.write(line)
        sys.stdout.flush()


def _wait(proc: subprocess.Popen[str], deadline: float, out: IO[str]) -> int | None:
    """pytest's exit status, or None when it is still running at *deadline*."""
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=max(0.1, min(5.0, deadline - time.time())))
        if time.time() >= deadline:
            message = "== run.py: over --max-minutes, stopping pytest\n"
            out.write(message)
            print(message, end="", flush=True)
            return None


def _stop_all(proc: subprocess.Popen[str]) -> None:
    """Stop *proc*, its process group, and every process left that it started.

    Processes that left the group (``setsid``) and lost their parent are reparented to this
    process (a child subreaper, see :func:`main`), so they are among its children too.
    """
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    left = psutil.Process().children(recursive=True)
    running = [p for p in left if _running(p)]  # the others are zombies, only to be reaped
    for child in running:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(left, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(alive, timeout=10)
    if running:
        names = ", ".join(sorted({_name(p) for p in running}))
        print(f"== run.py: stopped {len(running)} leftover process(es): {names}", flush=True)


def _running(process: psutil.Process) -> bool:
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _name(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()[:4]) or process.name()
    except psutil.Error:
        return str(process.pid)


def _summary_line(text: str) -> str:
    """pytest's last line, ``== 9 failed, 384 passed, ... in 1500.00s (0:25:00) ==``."""
    for line in reversed(text.splitlines()):
        if re.match(r"^=+ .* in [\d.]+s", line):
            return line.strip("= ")
    return "(no pytest summary line)"


def _git_state() -> str:
    """``<HEAD>``, or ``<HEAD> + uncommitted celery_extras/ (diff <sha1>)``."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
        ).stdout

    try:
        rev = git("rev-parse", "--short", "HEAD").strip()
        untracked = git("ls-files", "--others", "--exclude-standard", "--", "celery_extras")
        diff = git("diff", "HEAD", "--", "celery_extras")
        for name in untracked.split():
            diff += name + "\n" + (ROOT / name).read_text(errors="replace")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    if not diff:
        return rev
    digest = hashlib.sha1(diff.encode(), usedforsecurity=False).hexdigest()[:10]
    return f"{rev} + uncommitted celery_extras/ (diff {digest})"


# --- reading and comparing the results ------------------------------------------------------


def read_junit(path: Path) -> dict[str, Outcome]:
    """The outcome of each test; a test pytest wrote twice (a failure, then an error at its
    teardown, each in a ``testcase`` of its own) is one test with both."""
    cases: dict[str, ET.Element] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        node = _node_id(case)
        if node in cases:
            cases[node].extend(list(case))
        else:
            cases[node] = case
    return {node: _outcome(case) for node, case in cases.items()}


def _node_id(case: ET.Element) -> str:
    classname, name, file = (case.get(k, "") for k in ("classname", "name", "file"))
    if not file:  # a collection error: name is the module
        return classname + "::" + name if classname else name
    module = file.removesuffix(".py").replace("/", ".")
    classes = classname.removeprefix(module).strip(".")
    return "::".join([file, *classes.split("."), name] if classes else [file, name])


def _first_line(element: ET.Element) -> str:
    text = element.get("message") or (element.text or "").strip()
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 240 else line[:237] + "..."


def _outcome(case: ET.Element) -> Outcome:
    failure, skipped = case.find("failure"), case.find("skipped")
    errors = case.findall("error")
    setup = [e for e in errors if (e.get("message") or "").startswith("failed on setup")]
    teardown = [e for e in errors if (e.get("message") or "").startswith("failed on teardown")]
    other = [e for e in errors if e not in setup and e not in teardown]
    if failure is not None:
        status, message = "failed", _first_line(failure)
    elif setup or other:
        status, message = "error", _first_line((setup or other)[0])
    elif skipped is not None:
        xfail = skipped.get("type") == "pytest.xfail"
        status, message = ("xfailed" if xfail else "skipped"), _first_line(skipped)
    else:
        status, message = "passed", ""
    if teardown:
        status += "+teardown-error"
        message = message or _first_line(teardown[0])
    return Outcome(status, message, _first_line(teardown[0]) if teardown else "")


def forgive_due_queue(outcomes: dict[str, Outcome]) -> int:
    """Drop the teardown errors of :data:`DUE_QUEUE_CHECK` from *outcomes*; how many."""
    forgiven = 0
    for outcome in outcomes.values():
        if outcome.status.endswith("+teardown-error") and DUE_QUEUE_CHECK.search(outcome.teardown):
            outcome.status = outcome.status.removesuffix("+teardown-error")
            if outcome.message == outcome.teardown:
                outcome.message = ""
            forgiven += 1
    return forgiven


def counts(outcomes: dict[str, Outcome]) -> Counter[str]:
    """Counted as pytest does: a teardown error counts as an error beside the test's own."""
    tally: Counter[str] = Counter()
    for outcome in outcomes.values():
        status, _, teardown = outcome.status.partition("+")
        tally[status] += 1
        if teardown:
            tally["error"] += 1
    tally["tests"] = len(outcomes)
    return tally


def xpassed(log: Path) -> set[str]:
    """Tests the log shows as XPASS (the junit XML has them as passed)."""
    if not log.exists():
        return set()
    text = log.read_text(encoding="utf-8", errors="replace")
    return set(re.findall(r"^(t/\S.*?) XPASS\b", text, flags=re.MULTILINE))


def reruns(log: Path) -> Counter[str]:
    """How many times the log shows each test rerun (pytest-rerunfailures, ``@flaky``)."""
    if not log.exists():
        return Counter()
    text = log.read_text(encoding="utf-8", errors="replace")
    return Counter(re.findall(r"^(t/\S.*?) RERUN\b", text, flags=re.MULTILINE))


def load(results: Path, mode: str) -> Run | None:
    xml, record = results / f"{mode}.xml", results / f"{mode}.json"
    if not xml.exists():
        return None
    meta = json.loads(record.read_text()) if record.exists() else {}
    outcomes = read_junit(xml)
    for test in xpassed(results / f"{mode}.log"):
        if test in outcomes and outcomes[test].status.startswith("passed"):
            outcomes[test].status = "x" + outcomes[test].status
    if mode == "with-policies":
        meta["due_queue_teardowns"] = forgive_due_queue(outcomes)
    return Run(mode, outcomes, meta, reruns(results / f"{mode}.log"))


def compare_all(results: Path) -> tuple[str, int]:
    """Each mode with results compared with the plain run; the worst exit status."""
    plain = load(results, "plain")
    others = [run for run in (load(results, mode) for mode in OTHERS) if run is not None]
    if not others:
        return compare(plain, None)
    reports, statuses = zip(*(compare(plain, run) for run in others), strict=True)
    return "\n\n".join(reports), max(statuses)


def compare(plain: Run | None, extras: Run | None) -> tuple[str, int]:
    runs = [r for r in (plain, extras) if r is not None]
    lines: list[str] = []
    width = 20
    head = f"{'':<{width}}" + "".join(f"{r.mode:>16}" for r in runs)
    lines += [head, "-" * len(head)]
    tallies = [counts(r.outcomes) for r in runs]
    for key in ("tests", "passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        lines.append(f"{key:<{width}}" + "".join(f"{t[key]:>16}" for t in tallies))
    for key, label in (("duration_s", "duration (s)"), ("returncode", "pytest exit code")):
        lines.append(f"{label:<{width}}" + "".join(f"{r.record.get(key)!s:>16}" for r in runs))
    lines.append("")
    for r in runs:
        lines.append(f"{r.mode}: {r.record.get('summary', '?')}")
        lines.append(
            f"{'':<{len(r.mode)}}  started {r.record.get('started', '?')}, "
            f"celery {r.record.get('celery', '?')}, celery-extras at {r.record.get('git', '?')}"
        )
        if r.mode != "plain":
            lines.append(
                f"{'':<{len(r.mode)}}  celery_extras.install(app) ran on "
                f"{r.record.get('installed_on_apps')} apps"
            )
        if r.mode == "with-policies":
            lines.append(
                f"{'':<{len(r.mode)}}  policies stacked on {r.record.get('policed_tasks')} "
                f"tasks; {r.record.get('due_queue_teardowns')} teardown errors of the suite's "
                "one-queue check (the due queue, by design) not counted"
            )
        if r.record.get("tests", "t/integration") != "t/integration":
            lines.append(f"{'':<{len(r.mode)}}  ran {r.record['tests']} only")
    if plain is None or extras is None:
        lines.append("\nonly one mode has results: nothing to compare")
        return "\n".join(lines) + "\n", 2
    if extras.record.get("installed_on_apps") in (None, 0):
        lines.append(f"\nthe {extras.mode} run shows no app with celery-extras installed")
        return "\n".join(lines) + "\n", 2
    if extras.mode == "with-policies" and extras.record.get("policed_tasks") in (None, 0):
        lines.append("\nthe with-policies run shows no task with the stacked policies")
        return "\n".join(lines) + "\n", 2

    ids = sorted(set(plain.outcomes) | set(extras.outcomes))
    missing = Outcome("absent", "")
    differ = [
        i
        for i in ids
        if plain.outcomes.get(i, missing).status != extras.outcomes.get(i, missing).status
    ]
    lines.append(f"\nTests whose outcome differs ({len(differ)}):")
    for i in differ:
        p, e = plain.outcomes.get(i, missing), extras.outcomes.get(i, missing)
        lines.append(f"  {i}\n      plain: {p.status}  {extras.mode}: {e.status}")
        for label, outcome in (("plain", p), (extras.mode, e)):
            if outcome.message:
                lines.append(f"      {label}: {outcome.message}")
    rerun = [i for i in ids if plain.reruns[i] or extras.reruns[i]]
    lines.append("\nTests rerun by @flaky (the outcome above is the last attempt's):")
    for i in rerun:
        note = "" if plain.reruns[i] == extras.reruns[i] else "   <- differs"
        lines.append(
            f"  {i}\n      reruns plain: {plain.reruns[i]}  {extras.mode}: {extras.reruns[i]}{note}"
        )
    same = [
        i
        for i in ids
        if i not in differ
        and plain.outcomes[i].status not in ("passed", "skipped", "xfailed", "xpassed")
    ]
    lines.append(f"\nNot passing in either run, the same way ({len(same)}):")
    for i in same:
        lines.append(f"  {i}  [{plain.outcomes[i].status}]\n      {plain.outcomes[i].message}")
    return "\n".join(lines) + "\n", (1 if differ else 0)


# --- command line ---------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m tests.celery_suite.run",
        description="Celery's own t/integration on Redis, plain and with celery-extras.",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--plain", dest="modes", action="store_const", const=["plain"], help="plain Celery only"
    )
    which.add_argument(
        "--with-extras",
        dest="modes",
        action="store_const",
        const=["with-extras"],
        help="with celery_extras.install(app) on every app only",
    )
    which.add_argument(
        "--with-policies",
        dest="modes",
        action="store_const",
        const=["with-policies"],
        help="with install(app) and limit+concurrency+coalesce stacked on every suite task only",
    )
    which.add_argument(
        "--canvas-policies",
        dest="modes",
        action="store_const",
        const=["plain", "with-policies"],
        help=f"plain, then with-policies, of {CANVAS_TESTS} only (unless --tests says)",
    )
    which.add_argument(
        "--both",
        dest="modes",
        action="store_const",
        const=["plain", "with-extras"],
        help="plain, then with-extras (the default)",
    )
    which.add_argument(
        "--compare-only",
        dest="modes",
        action="store_const",
        const=[],
        help="print the comparison of the saved results, run nothing",
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="%(default)s")
    parser.add_argument(
        "--tests",
        default=None,
        help=f"what of t/ to run (t/integration; --canvas-policies: {CANVAS_TESTS})",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="where the junit xml, logs and summary go (.celery-suite/results; "
        "--canvas-policies: .celery-suite/results/canvas)",
    )
    parser.add_argument("--timeout", type=int, default=300, help="per test, seconds (%(default)s)")
    parser.add_argument(
        "--max-minutes", type=float, default=90, help="per run, then it is stopped (%(default)s)"
    )
    canvas = "--canvas-policies" in argv
    args = parser.parse_args(argv)
    if args.modes is None:
        args.modes = ["plain", "with-extras"]
    if args.tests is None:
        args.tests = CANVAS_TESTS if canvas else "t/integration"
    if args.results is None:  # a partial run keeps its results apart from the whole suite's
        args.results = RESULTS / "canvas" if canvas else RESULTS
    return args, extra


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = parse(sys.argv[1:] if argv is None else argv)
    results = args.results.resolve()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    with contextlib.suppress(OSError, AttributeError):  # orphans of the suite come back to us
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "run.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("another tests.celery_suite.run is running (.celery-suite/run.lock)")
            return 2
        try:
            tree = suite_tree(celery_version()) if args.modes else None
            for mode in args.modes:
                assert tree is not None
                run_mode(mode, tree, results, args.redis, args.timeout, args.max_minutes, extra,
                         args.tests)  # fmt: skip
        except (Interrupted, KeyboardInterrupt) as exc:
            print(f"== run.py: interrupted ({exc or 'SIGINT'})", flush=True)
            return 2
        report, status = compare_all(results)
    missing = [m for m in args.modes if not (results / f"{m}.xml").exists()]
    if missing:
        report += f"\nno junit xml from: {', '.join(missing)}\n"
        status = 2
    print("\n" + report, end="")
    results.mkdir(parents=True, exist_ok=True)
    (results / "summary.txt").write_text(report)
    print(f"\nresults: {results}/ (plain.*, with-extras.*, with-policies.*, summary.txt)")
    return status


if __name__ == "__main__":
    sys.exit(main())
