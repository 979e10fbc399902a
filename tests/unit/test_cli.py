"""The command line's loud refusals, in process: an unknown task name (with the closest
ones), a store that does not answer (one line, exit 1), and no terminal codes in output that
is not a terminal's. Real ``celery`` processes: tests/integration/test_stats_cli.py."""

from __future__ import annotations

import socket
import uuid

import pytest
from celery import Celery
from click.testing import CliRunner, Result

import celery_extras
from celery_extras import coalesce, concurrency, limit


def _closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then let go)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port: int = taken.getsockname()[1]
    return port


PORT = _closed_port()
#: The store does not answer; the broker is in memory.
down = celery_extras.install(
    Celery("cli-down", broker="memory://", set_as_current=False),
    redis_url=f"redis://127.0.0.1:{PORT}/0",
)
#: The store answers (the suite's Redis, keys of their own).
up = celery_extras.install(
    Celery("cli-up", broker="memory://", set_as_current=False),
    redis_url="redis://127.0.0.1:6379/0",
    key_prefix=f"cli-{uuid.uuid4().hex[:8]}",
)

for _app in (down, up):

    @limit("5/s")
    @_app.task(name=f"{_app.main}.limited", shared=False)
    def limited() -> None: ...

    @concurrency(2)
    @_app.task(name=f"{_app.main}.capped", shared=False)
    def capped() -> None: ...

    @coalesce(key=lambda args, kwargs: args[0])
    @_app.task(name=f"{_app.main}.coalesced", shared=False)
    def coalesced(key: str) -> None: ...


def extras(app: str, *args: str) -> Result:
    """``celery -A tests.unit.test_cli:<app> extras ARGS``, output not a terminal."""
    from celery.bin.celery import celery

    return CliRunner().invoke(celery, ["-A", f"{__name__}:{app}", "extras", *args])


def one_line_error(result: Result) -> str:
    """The error a command printed: one line, no traceback, exit 1."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("Error: "), result.stderr
    return errors[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["concurrency", "cli-down.cappd", "3"],
         "Error: cli-down.cappd: no task of this app has that name; did you mean cli-down.capped"),
        # the limited tasks listed are the app's: the shared tasks imported by the process too
        (["limit", "cli-down.limitd", "7/s", "--timeout", "0.1"],
         "declares no limit() for it; nothing stored (limited tasks: "),
        (["limit", "cli-down.limitd", "7/s", "--timeout", "0.1"],
         "); did you mean cli-down.limited"),
        (["limit", "--reset", "cli-down.limitd", "--timeout", "0.1"],
         "did you mean cli-down.limited"),
    ],
)  # fmt: skip
def test_an_unknown_task_name_is_refused_with_the_closest_names(args: list[str], said: str) -> None:
    error = one_line_error(extras("down", *args))
    assert said in error, error  # refused before the store is asked: not "store down"


def test_limit_show_refuses_an_unknown_task_name_with_the_closest() -> None:
    """Read after the store: a name no app task has may still have a stored rate to show."""
    error = one_line_error(extras("up", "limit", "--show", "cli-up.limitd", "--timeout", "0.1"))
    assert error == ("Error: cli-up.limitd: no worker limits this task, and no rate is stored; "
                     "did you mean cli-up.limited?"), error  # fmt: skip


def test_delayed_drop_refuses_an_unknown_task_name_with_the_closest() -> None:
    error = one_line_error(extras("up", "delayed", "--drop", "cli-up.coalescd", "-f"))
    assert "cli-up.coalescd: no task of this app has that name" in error
    assert error.endswith("; did you mean cli-up.coalesced?"), error


@pytest.mark.parametrize(
    "args",
    [
        ["limit", "cli-down.limited", "7/s", "--timeout", "0.1"],
        ["limit", "--reset", "cli-down.limited", "--timeout", "0.1"],
        ["limit", "--show", "--timeout", "0.1"],
        ["concurrency", "cli-down.capped", "3"],
        ["concurrency", "cli-down.capped", "--reset"],
        ["revoked", "--timeout", "0.1"],
        ["revoked", "--timeout", "0.1", "--json"],
        ["delayed"],
        ["delayed", "--json"],
        ["delayed", "--drop", "cli-down.limited", "-f"],
        ["coalesce"],
        ["coalesce", "--json"],
    ],
    ids=" ".join,
)
def test_with_the_store_down_each_command_says_so_in_one_line(args: list[str]) -> None:
    error = one_line_error(extras("down", *args))
    assert error.startswith(
        f"Error: store down: the store at redis://127.0.0.1:{PORT}/0 does not answer ("
    ), error
    assert "Connection" in error, error


@pytest.mark.parametrize(
    ("app", "args"),
    [
        ("down", ["top", "--iterations", "2", "--refresh", "0.1", "--timeout", "0.1"]),
        ("down", ["settings"]),
        ("down", ["settings", "--json"]),
        ("up", ["delayed", "--json"]),
        ("up", ["delayed"]),
        ("up", ["coalesce", "--json"]),
        ("up", ["revoked", "--json", "--timeout", "0.1"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_output_that_is_not_a_terminal_has_no_terminal_codes(app: str, args: list[str]) -> None:
    result = extras(app, *args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.strip(), "no output"
    assert "\x1b" not in result.output, repr(result.output[:200])
