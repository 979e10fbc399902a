"""The test session's own set-up (tests/conftest.py)."""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.shared_brokers import PREREQUISITES, SHARED, plan, running


def test_under_xdist_each_process_holds_at_most_two_tests_ahead(
    pytestconfig: pytest.Config,
) -> None:
    """``--maxschedchunk=1`` under pytest-xdist, set by tests/conftest.py (not pyproject.toml's
    ``addopts``, which would need xdist for the example project's tests too)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("not under pytest-xdist")
    if any(arg.startswith("--maxschedchunk") for arg in pytestconfig.invocation_params.args):
        pytest.skip("--maxschedchunk given")
    assert pytestconfig.getoption("maxschedchunk") == 1


def _plan(answering: set[int], installed: set[str]) -> tuple[list[str], str]:
    down, missing = plan(SHARED, lambda service: service.port in answering, installed.__contains__)
    return [s.name for s in down], missing


EVERY_BINARY = {"redis-server", "redis-cli", "rabbitmq-server", "rabbitmqctl"}


def test_the_session_starts_only_the_brokers_that_do_not_answer() -> None:
    assert _plan({6379, 5672}, EVERY_BINARY) == ([], "")
    assert _plan({6379, 5672}, set()) == ([], "")  # nothing asked of a broker that answers
    assert _plan({5672}, EVERY_BINARY) == (["Redis"], "")
    assert _plan({6379}, EVERY_BINARY) == (["RabbitMQ"], "")
    assert _plan(set(), EVERY_BINARY) == (["Redis", "RabbitMQ"], "")


def test_a_missing_binary_fails_the_session_in_one_line_naming_the_debian_packages() -> None:
    down, missing = _plan({6379}, EVERY_BINARY - {"rabbitmqctl"})
    assert down == [] and "\n" not in missing
    assert missing.startswith(
        "RabbitMQ does not answer on 127.0.0.1:5672 and rabbitmqctl is not installed: "
        "apt-get install rabbitmq-server ("
    )
    assert "apt-get install redis-server rabbitmq-server chromium tmux" in missing
    down, missing = _plan(set(), {"redis-cli"})
    assert down == [] and "apt-get install redis-server rabbitmq-server (" in missing
    assert missing.count("is not installed") == 3


def test_a_service_with_its_port_closed_runs_when_its_alive_command_succeeds() -> None:
    """A RabbitMQ node whose application a test stopped (its port closed) is running: the
    session neither starts it nor, at its end, stops it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    down = replace(SHARED[1], port=closed)
    assert running(replace(down, alive=("true",)))
    assert not running(replace(down, alive=("false",)))
    assert not running(replace(down, alive=()))
    assert not running(replace(down, alive=("no-such-binary-here",)))


def test_the_brokers_start_and_stop_as_ci_does_and_the_readme_names_the_packages() -> None:
    root = Path(__file__).parents[2]
    ci = " ".join((root / ".ci" / "run").read_text().replace("\\\n", " ").split())
    for service in SHARED:
        for command in service.start:
            assert " ".join(a or '""' for a in command) in ci, command
    assert "rabbitmqctl await_startup --timeout 120" in ci
    assert f"`{PREREQUISITES}`" in (root / "README.md").read_text()
