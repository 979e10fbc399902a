"""Every code block of docs/ that a user would copy runs here as written, in document
order, one namespace per page, around a real installed app (``app``, module ``proj``):

* Python is executed statement by statement; an expression followed by a literal
  comment (``settings["stats_interval"]  # 2.0``) must give that value; each app the
  block configured is validated again (``install(app)``: settings and store checks), and
  each task it decorated carries its policy.
* ``celery -A proj extras ...`` commands that stop by themselves run in process against
  the page's app (memory broker, the suite's Redis as store under a key prefix of its
  own): the exit status and the output lines shown, in order, must be what it prints
  (any number where a number is shown). On a page whose output shows workers' replies
  (:data:`WITH_WORKER`) a real worker ``w1`` of the page's app answers them, on a
  redis-server of its own. Other commands (``worker``, ``flower``, ``top``, ``python -m
  bench``, ``pip``) are parsed by their own parsers, which must accept them, and the
  tasks they name must exist.
* Output shown to be read, not copied, is named as such with what checks it.

"""

from __future__ import annotations

import ast
import re
import shlex
import sys
import tomllib
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner

import celery_extras
from celery_extras.admission.registry import policies_of
from celery_extras.settings import declared_settings
from tests.docs.blocks import DOCS, Block, blocks_of, commands, python_blocks
from tests.support.shared_tasks import shared_tasks_isolated

ROOT = DOCS.parent
#: pages written by others at the moment, whose blocks are not checked here yet
STORE = "redis://127.0.0.1:6379/0"
#: the app ``celery -A tests.docs.test_docs_blocks:CLI`` loads: the page's, set per command
CLI: Celery | None = None


@dataclass
class Page:
    """A page's namespace, as its blocks leave it."""

    name: str
    names: dict[str, Any] = field(default_factory=dict)
    shared: set[Any] = field(default_factory=set)  # Celery's shared tasks before the page
    worker: str | None = None  # the hostname of the page's real worker, if it has one

    @property
    def app(self) -> Celery:
        app: Celery = self.names["app"]
        return app


def docs_app(broker: str = "memory://", store: str = STORE, prefix: str = "") -> Celery:
    return celery_extras.install(
        Celery("proj", broker=broker, set_as_current=False),
        redis_url=store,
        key_prefix=prefix or f"docs-{uuid.uuid4().hex[:8]}",
    )


# -- Python ------------------------------------------------------------------------------


def literal_comment(source: list[str], node: ast.stmt) -> tuple[bool, Any]:
    """``(True, value)`` when *node*'s last line ends in a comment that is a literal."""
    line = source[(node.end_lineno or node.lineno) - 1]
    if "#" not in line:
        return False, None
    try:
        return True, ast.literal_eval(line.split("#", 1)[1].strip())
    except (ValueError, SyntaxError):
        return False, None


def run_python(block: Block, page: Page) -> None:
    """Execute *block* in the page's namespace, then check what it declared."""
    before = set(page.app.tasks)
    source = block.text.splitlines()
    tree = ast.parse(block.text, f"{block.page}:{block.line}")
    for node in tree.body:
        code = ast.Module(body=[node], type_ignores=[])
        exec(compile(code, f"docs/{block.page}", "exec"), page.names)
        shown, value = literal_comment(source, node)
        if shown and isinstance(node, ast.Expr):
            got = eval(compile(ast.Expression(node.value), block.page, "eval"), page.names)
            assert got == value, f"{block.page}:{block.line + node.lineno - 1}: {got!r}"
    for app in {v for v in page.names.values() if isinstance(v, Celery)}:
        if declared_settings(app):  # installed: validate its settings and store's again
            celery_extras.install(app)
    for name in set(page.app.tasks) - before:
        decorated = any(d in block.text for d in ("@limit", "@concurrency", "@coalesce",
                                                   "@debounce", "@retry_policy"))  # fmt: skip
        if decorated and not name.startswith("celery."):
            assert policies_of(page.app.tasks[name]) is not None, name


def python(fresh: Callable[[], Celery] | None = None, **names: Any) -> Callable[..., None]:
    """Run the block with *names* added to the page's namespace first, and as its ``app``
    a *fresh* one (which gets no task the page's earlier blocks shared)."""

    def check(block: Block, page: Page) -> None:
        if fresh is not None:
            from celery import _state

            later = set(_state._on_app_finalizers)
            _state._on_app_finalizers.intersection_update(page.shared)
            page.names["app"] = fresh()
            page.names["app"].finalize()
            _state._on_app_finalizers.update(later)
        page.names.update(names)
        run_python(block, page)

    return check


def plain_app() -> Celery:
    return Celery("proj", broker="memory://", set_as_current=False)


def alternatives(block: Block, page: Page) -> None:
    """A block of settings with ``# or ...`` alternatives: each validated on its own."""
    for part in re.split(r"\n\s*\n(?=# or )", block.text):
        run_python(Block(block.page, block.line, block.language, part), page)


# -- commands ----------------------------------------------------------------------------


def shown_line(line: str) -> re.Pattern[str]:
    """A line of shown output as a pattern: its numbers stand for any number."""
    parts = re.split(r"\d+(?:\.\d+)?", line.strip())
    return re.compile(r"\d+(?:\.\d+)?".join(re.escape(p) for p in parts))


def is_reply(line: str) -> bool:
    """A worker's reply (``  w1@host: ...``): no worker runs here."""
    return bool(re.match(r"\s+\S+@\S+: ", line))


def run_extras(page: Page, args: list[str], shown: list[str], status: int, first: bool) -> None:
    """Run ``celery -A proj extras ARGS`` on the page's app: exit *status*, and the lines
    *shown*, in order, as printed (the workers' replies only when the page has a worker,
    ``w1@host`` standing for its hostname); only the *first* one when the rest needs
    parked tasks. No line shown: any output."""
    from celery.bin.celery import celery

    global CLI
    CLI = page.app
    result = CliRunner().invoke(celery, ["-A", f"{__name__}:CLI", "extras", *args])
    output = [line.strip() for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == status, (args, result.output)
    if page.worker:
        shown = [line.replace("w1@host", page.worker) for line in shown]
    else:
        shown = [line for line in shown if not is_reply(line)]
    if not shown:
        return
    printed = output[:1] if first else output
    shown = shown[:1] if first else shown
    assert len(printed) == len(shown), (shown, output)
    for line, got in zip(shown, printed, strict=True):
        assert shown_line(line).fullmatch(got), (line, got)


def parse_celery(page: Page, args: list[str]) -> None:
    """Parse ``celery ARGS`` with Celery's own command line, running nothing."""
    from celery.bin.base import CLIContext
    from celery.bin.celery import celery

    assert args[:2] == ["-A", "proj"], args
    context = celery.make_context("celery", list(args), resilient_parsing=False)
    context.obj = CLIContext(app=page.app, no_color=True, workdir=None, quiet=True)
    protected = context.__dict__.get("_protected_args")  # click 8.2 deprecates the property
    words = [*(context.protected_args if protected is None else protected), *context.args]
    name, sub, rest = celery.resolve_command(context, words)
    assert sub is not None, args
    if name == "extras":
        name, sub, rest = sub.resolve_command(context, rest)  # type: ignore[attr-defined]
    sub.make_context(name, list(rest), parent=context)  # type: ignore[union-attr]
    for word in rest:
        if word.startswith("proj."):
            assert word in page.app.tasks, f"{word}: no such task on the page"


def parse_bench(args: list[str]) -> None:
    import importlib

    module = importlib.import_module(f"bench.{args[0]}")
    module._options(args[1:])  # argparse: exits (status 2) on what it refuses


def pip(args: list[str]) -> None:
    """A ``pip install`` line: what it installs exists (tests/unit/test_publishing.py)."""
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])  # fmt: skip
    assert args[:1] == ["install"], args
    for target in args[1:]:
        if target.startswith("-"):
            continue
        assert re.fullmatch(r"(\.|celery-extras)(\[[\w,-]+\])?", target), target
        named = re.findall(r"\[([\w,-]+)\]", target)
        assert not named or set(named[0].split(",")) <= extras, target


@dataclass(frozen=True)
class Shell:
    """Each command of the block: run when it is an ``extras`` one in :data:`RUNNABLE`
    (*first_only*: only the first line shown is compared: the rest needs parked tasks),
    else parsed."""

    first_only: bool = False

    def __call__(self, block: Block, page: Page) -> None:
        steps = commands(block)
        for at, (command, shown) in enumerate(steps):
            words = shlex.split(command)
            if words == ["echo", "$?"]:
                continue  # the status, checked with the command before it
            after = steps[at + 1] if at + 1 < len(steps) else ("", [])
            status = int(after[1][0]) if after[0] == "echo $?" else 0
            if (
                words[:2] == ["celery", "-A"]
                and words[3:4] == ["extras"]
                and (words[4] in RUNNABLE and not ({"--drop", "-f"} & set(words)))
            ):
                run_extras(page, words[4:], shown, status, self.first_only)
            elif words[0] == "celery":
                parse_celery(page, words[1:])
            elif words[:3] == ["python", "-m", "bench"]:
                parse_bench(words[3:])
            elif words[0] == "pip":
                pip(words[1:])
            else:
                raise AssertionError(f"{block.page}:{block.line}: no check for {command!r}")


#: ``extras`` commands that need no worker and stop by themselves
RUNNABLE = {"settings", "limit", "delayed", "concurrency"}


def output(what_checks_it: str) -> Callable[[Block, Page], None]:
    """Output shown to be read, not copied; *what_checks_it* names the test that does."""

    def check(block: Block, page: Page) -> None:
        path, _, test = what_checks_it.partition("::")
        assert test in (ROOT / path).read_text(), what_checks_it

    return check


def modules_named(block: Block, page: Page) -> None:
    """A diagram of the code: every module it names in brackets (``(delay/gate.py)``) is
    one of the package's."""
    named = re.findall(r"\(([\w/]+\.py)\)", block.text)
    assert named, f"{block.page}:{block.line}: names no module"
    missing = [m for m in named if not (ROOT / "celery_extras" / m).is_file()]
    assert missing == [], f"{block.page}:{block.line}: no such module {missing}"


def the_event_shown(block: Block, page: Page) -> None:
    """The ``worker-throughput`` event as the page shows it: the counters it names are
    the recorder's first ones, in order (the page lists those added since apart), the
    runtime's figures are the recorder's, the windows the default ones."""
    from celery_extras.stats.recorder import BASE_COUNTERS, PERCENTILES

    shown = re.findall(r'"(\w+)": \[', block.text)
    assert shown[1:] == list(BASE_COUNTERS), shown  # "windows" first
    runtime = re.search(r'"runtime": \{(.*?)\}', block.text, re.S)
    assert runtime is not None
    figures = re.findall(r'"(\w+)":', runtime[1])
    assert figures == ["count", "sum", "max", *(f"p{p}" for p in PERCENTILES)]
    windows = re.search(r'"windows": (\[.*?\])', block.text)
    assert windows is not None
    assert ast.literal_eval(windows[1]) == celery_extras.settings_of(page.app)["stats_windows"]


def django(block: Block, page: Page) -> None:
    """``config_from_object("django.conf:settings", namespace="CELERY")`` on the next
    block's ``settings.py``: a ``django.conf`` module holding it stands in for Django."""
    page.names["Celery"] = Celery
    page.names["celery_extras"] = celery_extras
    page.names["pending"] = block


def django_settings(block: Block, page: Page) -> None:
    settings = types.ModuleType("settings")
    exec(block.text, settings.__dict__)
    conf = types.ModuleType("django.conf")
    conf.settings = settings  # type: ignore[attr-defined]
    saved = {k: sys.modules.get(k) for k in ("django", "django.conf")}
    sys.modules.update({"django": types.ModuleType("django"), "django.conf": conf})
    try:
        run_python(page.names.pop("pending"), page)
        values = celery_extras.settings_of(page.app)
    finally:
        for key, module in saved.items():
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module
    assert (values["key_prefix"], values["queue_weights"]) == ("shop", {"high": 4, "low": 1})


def the_error_shown(block: Block, page: Page) -> None:
    """The misspelled setting's message, as the page shows it, from a real app."""
    from celery.exceptions import ImproperlyConfigured

    app = celery_extras.install(Celery("proj", set_as_current=False))
    app.conf.extras_key_prefx = "proj"
    with pytest.raises(ImproperlyConfigured) as raised:
        celery_extras.settings_of(app)  # as the worker's step does at its start
    assert f"{type(raised.value).__name__}: {raised.value}" == block.text.strip()


def flowerconfig(block: Block, page: Page) -> None:
    """A file's content, then the command that uses it."""
    config, command = block.text.split("\n\n$ ")
    compile(config, "flowerconfig.py", "exec")
    from celery_extras.flower import in_flower

    assert callable(in_flower)
    parse_celery(page, shlex.split(command)[1:])


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(STORE)


#: (page, the start of a block's first line) -> how the block is checked
CHECKS: dict[tuple[str, str], Callable[[Block, Page], None]] = {
    ("architecture.rst", "message ──▶ arrival gate (delay/gate.py)"): modules_named,
    ("batch.rst", "from celery_extras import batch"): python(),
    # a test of the testing plugin's, run as a user's by tests/integration/test_testing_plugin.py
    ("batch.rst", "results = [index.delay(word) for word in ("): output(
        'docs/examples/test_user_tasks.py::results = [index.delay(word) for word in ("a", "b"'
    ),
    ("coalesce.rst", "from celery_extras import coalesce"): python(),
    ("concurrency.rst", "from celery_extras import concurrency, li"): python(),
    # plain Celery's hand-written lock, the page's "before": an app without celery-extras
    ("concurrency.rst", "@app.task(bind=True, max_retries=None)"): python(
        plain_app, r=_redis(), do_export=print
    ),
    ("concurrency.rst", "@concurrency(2)"): python(docs_app),
    ("configuration.rst", "from celery_extras import settings_of"): python(),
    ("configuration.rst", 'app = Celery("proj")'): django,
    ("configuration.rst", "# settings.py"): django_settings,
    ("consumer.rst", 'app.conf.extras_queue_weights = {"high":'): python(),
    ("consumer.rst", "$ celery -A proj worker -Q high,low"): Shell(),
    ("debounce.rst", "from celery_extras import debounce"): python(),
    ("delay.rst", "$ celery -A proj extras delayed"): Shell(first_only=True),
    ("delay.rst", "$ celery -A proj purge -f"): Shell(),
    ("delay.rst", "Kept 2 parked tasks recording no queue,"): output(
        "tests/unit/test_delay_purge.py::Kept 2 parked tasks recording no queue, whose "
        "exchange and routing key may lead to "
    ),
    ("delay.rst", "Error: the queues were purged, but the de"): output(
        "tests/unit/test_delay_purge.py::Error: the queues were purged, but the delay "
        "store did not answer ("
    ),
    ("delay.rst", "$ celery -A proj extras delayed --drop pr"): Shell(),
    ("delay.rst", "figure"): output("bench/delay.py::def measure"),
    # the included tasks' worker: tests/integration/test_memoize.py runs the same command
    ("memoize.rst", "$ celery -A proj extras memoize --forget"): output(
        'tests/integration/test_memoize.py::extras(memo, "memoize", "--forget", SQUARE'
    ),
    # celery-batches' code, shown for comparison, not to copy: its replacement runs
    ("migrating-from-celery-batches.rst", "# celery-batches: before"): output(
        "tests/integration/test_batch_peer.py::tasks_batch_migrated"
    ),
    ("policies.rst", "from celery_extras import limit, retry_po"): python(),
    ("policies.rst", '@limit("10000/h", burst=10000)'): python(),
    ("policies.rst", "$ celery -A proj extras limit proj.fetch 5"): Shell(),
    ("policies.rst", "$ celery -A proj extras limit proj.call_a"): Shell(),
    ("policies.rst", "$ celery -A proj extras limit proj.fech 50"): Shell(),
    ("policies.rst", "$ celery -A proj extras limit --show"): Shell(),
    ("priority.rst", "app.conf.extras_priority = True"): python(),
    ("queues.rst", "app.conf.extras_queue_concurrency = {"): python(),
    ("quickstart.rst", "pip install -e ."): Shell(),
    ("quickstart.rst", "from celery import Celery"): python(),
    ("quickstart.rst", 'celery_extras.install(app, key_prefix="pr'): python(),
    ("quickstart.rst", "celery -A proj extras settings"): Shell(),
    ("quickstart.rst", "ImproperlyConfigured: extras_key_prefx: u"): the_error_shown,
    ("reliability.rst", "python -m bench chaos --minutes 60 --bro"): Shell(),
    ("stats.rst", '{"type": "worker-throughput", "hostname"'): the_event_shown,
    ("stats.rst", "celery -A proj extras top"): Shell(),
    ("stats.rst", "# flowerconfig.py"): flowerconfig,
    ("stats.rst", "celery -A proj extras exporter --port 980"): Shell(),
    ("store.rst", 'app.conf.extras_redis_url = "sentinel://'): alternatives,
    ("sync.rst", "app.control.revoke(task_id)"): python(
        task_id=str(uuid.uuid4()), id1=str(uuid.uuid4()), id2=str(uuid.uuid4())
    ),
    ("testing.rst", "$ pip install 'celery-extras[testing]'"): Shell(),
}


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.rst"))


def checks_of(block: Block) -> list[tuple[str, str]]:
    """The key of :data:`CHECKS` naming *block* (its page, and the longest start of its
    first line there), in a list: empty when none does."""
    keys = [(page, start) for page, start in CHECKS
            if page == block.page and block.first.startswith(start)]  # fmt: skip
    return sorted(keys, key=lambda key: len(key[1]))[-1:]


def test_every_block_has_one_check_and_every_check_a_block() -> None:
    found = [block for page in pages() for block in blocks_of(page)]
    unchecked = [f"{b.page}:{b.line} {b.first}" for b in found if not checks_of(b)]
    assert unchecked == []  # a new block: say how it is checked
    named = {key for block in found for key in checks_of(block)}
    assert sorted(set(CHECKS) - named) == []  # a block changed or gone


#: pages whose commands name tasks another page declares: its Python blocks run first
PRELUDE = {"delay.rst": ("policies.rst",)}
#: pages whose commands' output shows workers' replies: run with a real worker
WITH_WORKER = {"policies.rst"}


@pytest.fixture
def docs_worker(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """``(broker URL, key prefix, hostname)`` of a real worker ``w1`` of the page's app
    (tests/docs/policies_app.py), on a redis-server of its own: the control commands'
    broadcasts reach no other worker."""
    from tests.support.brokers import PrivateRedis
    from tests.support.workers import WorkerProcess

    redis = PrivateRedis(tmp_path).start()
    prefix = f"docs-{uuid.uuid4().hex[:8]}"
    env = {"DOCS_BROKER": redis.url, "DOCS_PREFIX": prefix}
    worker = WorkerProcess("w1", env, tmp_path / "w1.log", app="tests.docs.policies_app:app")
    try:
        worker.start()
        yield redis.url, prefix, worker.hostname
    finally:
        worker.stop()
        redis.stop()


@pytest.mark.parametrize("page", [p.name for p in pages() if blocks_of(p)])
def test_the_blocks_of_a_page_run_as_written(page: str, request: pytest.FixtureRequest) -> None:
    prefix = f"docs-{uuid.uuid4().hex[:8]}"
    # a page's tasks are not the next page's, nor other tests' its
    with shared_tasks_isolated(celerys_only=True) as shared:
        state = Page(page, {"__name__": "proj", "app": docs_app(prefix=prefix)}, shared)
        if page in WITH_WORKER:
            url, prefix, state.worker = request.getfixturevalue("docs_worker")
            state.names["app"] = docs_app(url, url, prefix)
        try:
            for block in [*(b for p in PRELUDE.get(page, ()) for b in python_blocks(DOCS / p)),
                          *blocks_of(DOCS / page)]:  # fmt: skip
                CHECKS[checks_of(block)[0]](block, state)
        finally:
            store = _redis()
            for key in store.scan_iter(f"{prefix}*"):  # what the page's commands stored
                store.delete(key)


def test_the_fair_consumer_example_consumes_by_weight() -> None:
    """docs/examples/fair_consumer.py (consumer.rst includes it), on kombu's memory
    transport: four messages in each queue, handled three high to one low."""
    import importlib.util

    from kombu import Connection, Queue

    spec = importlib.util.spec_from_file_location("fair_consumer", DOCS / "examples" /
                                                  "fair_consumer.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    handled: list[str] = []
    with Connection("memory://") as conn:
        worker = example.Worker(conn)

        def handle(body: str) -> None:
            handled.append(body)
            worker.should_stop = len(handled) == 8

        example.handle = handle
        with conn.Producer() as producer:
            for i in range(4):
                for queue in ("low", "high"):
                    producer.publish(f"{queue}{i}", routing_key=queue, declare=[Queue(queue)])
        worker.run()
    assert sorted(handled) == sorted(f"{q}{i}" for q in ("high", "low") for i in range(4))
    assert [body[:-1] for body in handled[:4]].count("high") == 3


def test_the_readme_s_example_runs_as_written() -> None:
    """README.md's Python block (its ``pip install`` lines: tests/unit/test_publishing.py)."""
    found = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(found) == 1
    with shared_tasks_isolated(celerys_only=True) as own:
        page = Page("README.md", {"__name__": "proj", "app": plain_app()}, own)
        run_python(Block("README.md", 1, "python", found[0]), page)
    assert sorted(name for name in page.app.tasks if name.startswith("proj.")) == [
        "proj.fetch",
        "proj.sync_account",
    ]


PEER = "tests/integration/test_batch_peer.py"
FIGURES = "tests/integration/test_queue_figures.py"  # checks the examples' metric names
#: what each page's ``literalinclude`` shows -> the test that runs (or writes) it
INCLUDED = {
    "../celery_extras/memoize/gate.py": "tests/integration/test_memoize.py::memoize",
    "../celery_extras/memoize/decorator.py": "tests/integration/test_memoize.py::memoize",
    "../celery_extras/memoize/policy.py": "tests/integration/test_memoize.py::memoize",
    "../celery_extras/policies.py": "tests/unit/test_structure.py::policies",
    "../tests/support/tasks_memoize.py": "tests/integration/test_memoize.py::tasks_memoize",
    "../tests/support/tasks_batch_migrated.py": f"{PEER}::tasks_batch_migrated",
    **{
        f"examples/queues/{name}": f"{FIGURES}::{name}"
        for name in ("keda-scaledobject.yaml", "hpa.yaml", "prometheus-adapter.yaml")
    },
    "examples/fair_consumer.py": "tests/docs/test_docs_blocks.py::fair_consumer.py",
    "examples/test_user_tasks.py": 'tests/integration/test_testing_plugin.py::glob("test_*.py")',
    "examples/test_user_config.py": 'tests/integration/test_testing_plugin.py::glob("test_*.py")',
    "_static/top-80x24.txt": "tests/integration/test_stats_top.py::top-80x24.txt",
}


def test_every_included_file_is_one_a_test_runs() -> None:
    pattern = re.compile(r"^\.\. literalinclude:: (\S+)", re.M)
    shown = {name for page in pages() for name in pattern.findall(page.read_text())}
    assert sorted(shown - set(INCLUDED)) == []
    for name, runs in INCLUDED.items():
        assert (DOCS / name).is_file(), name
        output(runs)(Block("", 0, "", ""), Page(""))
