"""The shared brokers on a fresh machine: the test session starts the Redis (127.0.0.1:6379)
and the RabbitMQ (127.0.0.1:5672) that do not answer, with the commands and options .ci/run
uses, and stops at its end only what it started (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["PREREQUISITES", "SHARED", "Service", "answers", "plan", "running", "start", "stop"]

#: the README's prerequisites line
PREREQUISITES = "apt-get install redis-server rabbitmq-server chromium tmux"


@dataclass(frozen=True)
class Service:
    name: str
    port: int
    package: str  # the Debian package of its binaries
    binaries: tuple[str, ...]
    start: tuple[tuple[str, ...], ...]  # run in turn once nothing answers on the port
    ready: tuple[str, ...]  # run once the port answers; returns when the service is ready
    stop: tuple[str, ...]
    up_within: float  # seconds
    dirs: tuple[str, ...] = ()  # made before it starts
    #: succeeds while the service runs with its port closed: a RabbitMQ node whose
    #: application was stopped is not the session's to start or stop
    alive: tuple[str, ...] = ()


REDIS = Service(
    "Redis", 6379, "redis-server", ("redis-server", "redis-cli"),
    start=(("redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port",
            "6379", "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
            "--logfile", "/var/log/redis/ci.log"),),
    ready=("redis-cli", "-p", "6379", "ping"),
    stop=("redis-cli", "-p", "6379", "shutdown", "nosave"),
    up_within=30.0, dirs=("/var/lib/redis", "/var/log/redis"),
)  # fmt: skip
RABBITMQ = Service(
    "RabbitMQ", 5672, "rabbitmq-server", ("rabbitmq-server", "rabbitmqctl"),
    start=(("rabbitmq-server", "-detached"),),
    ready=("rabbitmqctl", "await_startup", "--timeout", "120"),
    stop=("rabbitmqctl", "stop"),
    up_within=120.0, alive=("rabbitmqctl", "ping", "--timeout", "10"),
)  # fmt: skip
SHARED = (REDIS, RABBITMQ)


def answers(port: int) -> bool:
    """Whether something listens on 127.0.0.1:*port*."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def running(service: Service) -> bool:
    """Whether *service* answers on its port, or runs with its port closed (``alive``)."""
    if answers(service.port):
        return True
    if not service.alive:
        return False
    try:
        return subprocess.run(service.alive, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def plan(
    services: Sequence[Service],
    is_running: Callable[[Service], bool],
    installed: Callable[[str], bool],
) -> tuple[list[Service], str]:
    """``(the services to start, "")``: those not running; or ``([], the one line naming
    what to install)`` when a binary one of them needs is missing. Nothing is asked of a
    service that runs."""
    down = [s for s in services if not is_running(s)]
    missing = [(s, b) for s in down for b in s.binaries if not installed(b)]
    if not missing:
        return down, ""
    what = "; ".join(f"{s.name} does not answer on 127.0.0.1:{s.port} and {b} is not installed"
                     for s, b in missing)  # fmt: skip
    packages = " ".join(dict.fromkeys(s.package for s, _ in missing))
    return [], f"{what}: apt-get install {packages} (the test suite's: {PREREQUISITES})"


def installed(binary: str) -> bool:
    return shutil.which(binary) is not None


def start(service: Service) -> None:
    """Start *service* and wait until it is ready; RuntimeError naming what failed."""
    for path in service.dirs:
        os.makedirs(path, exist_ok=True)
    for command in service.start:
        subprocess.run(command, check=True, capture_output=True, timeout=60)
    deadline = time.monotonic() + service.up_within
    while not answers(service.port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{service.name} did not come up on 127.0.0.1:{service.port}")
        time.sleep(0.5)
    subprocess.run(service.ready, check=True, capture_output=True, timeout=service.up_within)


def stop(service: Service) -> None:
    subprocess.run(service.stop, check=True, capture_output=True, timeout=120)
