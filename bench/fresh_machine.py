"""``python -m bench.fresh_machine [PYTEST ARGS]``: the README's test command on a machine
where Redis and RabbitMQ are installed but stopped, without stopping this machine's.

The check runs in Linux namespaces of its own (``unshare -n -m``, as root): a network
namespace with only a loopback, where nothing listens on 6379 or 5672, and a mount
namespace where empty directories stand for ``/var/lib/{redis,rabbitmq}`` and
``/var/log/{redis,rabbitmq}`` (a RabbitMQ node of its own: its own database and Erlang
cookie). There it runs the test command (by default a subset: ``tests/unit`` and
``tests/integration/test_install.py``; the namespace has no network, so the checkout's
``.venv`` is used), then checks that the session started both brokers and stopped them:
no port answers, and no ``redis-server`` or RabbitMQ node runs in the namespace.

Erlang's port mapper (``epmd``), started by ``rabbitmq-server`` as on any machine, is
reported and then ended by this script (it would keep the namespace alive). Exit 0 when
the tests passed and the brokers were stopped; 1 otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.shared_brokers import SHARED, answers

__all__ = ["DEFAULT_TESTS", "PORTS", "PRIVATE_DIRS", "main"]

ROOT = Path(__file__).resolve().parent.parent
#: the README's command (``pytest -n 3``) on a subset: the whole suite needs browsers, tmux
#: and many minutes
DEFAULT_TESTS = (
    "-n", "3", "tests/integration/test_install.py", "tests/unit", "tests/docs", "-x", "-q",
)  # fmt: skip
PORTS = {service.name: service.port for service in SHARED}  # what tests/conftest.py starts
#: directory -> the user owning it (the broker's own), replaced by an empty one
PRIVATE_DIRS = {
    "/var/lib/redis": "redis",
    "/var/log/redis": "redis",
    "/var/lib/rabbitmq": "rabbitmq",
    "/var/log/rabbitmq": "rabbitmq",
}
INSIDE = "CELERY_EXTRAS_FRESH_MACHINE"


def namespace_processes() -> list[str]:
    """``"pid command"`` of every other process in this network namespace."""
    mine = os.readlink("/proc/self/ns/net")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.readlink(entry / "ns" / "net") != mine:
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:  # ended meanwhile
            continue
        if command:
            found.append(f"{entry.name} {command[:100]}")
    return found


def _private_dirs(base: Path) -> None:
    """Bind an empty directory, owned by the broker's user, over each of PRIVATE_DIRS."""
    for path, user in PRIVATE_DIRS.items():
        empty = base / path.strip("/").replace("/", "-")
        empty.mkdir()
        shutil.chown(empty, user, user)
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "--bind", str(empty), path], check=True)


def inside(pytest_args: list[str]) -> int:
    """The check, run in the namespaces."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    base = Path(tempfile.mkdtemp(prefix="fresh-machine-"))
    _private_dirs(base)
    before = {name: answers(port) for name, port in PORTS.items()}
    print(f"namespace: loopback only; {', '.join(PRIVATE_DIRS)} empty (under {base})")
    print("before: " + ", ".join(f"{n} on {PORTS[n]} {'answers' if up else 'does not answer'}"
                                 for n, up in before.items()))  # fmt: skip
    if any(before.values()):
        print("FAILED: a broker answers before the session: not a fresh machine")
        return 1
    command = [str(ROOT / ".venv" / "bin" / "pytest"), "-p", "no:cacheprovider", *pytest_args]
    print("$ " + " ".join(command), flush=True)
    began = time.monotonic()
    tests = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    took = time.monotonic() - began
    lines = tests.stdout.splitlines()
    started = [line for line in lines if "starting it" in line]
    print("\n".join(started + lines[-3:]))
    print(f"pytest: exit {tests.returncode} in {took:.1f} s")
    time.sleep(2)  # the last beam processes exit after `rabbitmqctl stop` returns
    after = {name: answers(port) for name, port in PORTS.items()}
    left = namespace_processes()
    brokers = [p for p in left if "redis-server" in p or "beam" in p]
    epmd = [p for p in left if "epmd" in p]
    print("after: " + ", ".join(f"{n} on {PORTS[n]} {'answers' if up else 'does not answer'}"
                                for n, up in after.items()))  # fmt: skip
    print(f"brokers left running in the namespace: {brokers or 'none'}")
    print(f"epmd (Erlang's port mapper, started by rabbitmq-server): {epmd or 'none'}")
    for line in epmd:
        os.kill(int(line.split()[0]), 15)
    ok = tests.returncode == 0 and len(started) == 2 and not any(after.values()) and not brokers
    if tests.returncode != 0:  # the first failure, as pytest tells it
        failures = tests.stdout.find("= FAILURES =")
        print(tests.stdout[max(failures, 0) :][:6000] + tests.stderr[-2000:])
    if ok:
        shutil.rmtree(base, ignore_errors=True)  # the brokers' files; kept to read on failure
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if os.environ.get(INSIDE):
        return inside(argv or list(DEFAULT_TESTS))
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("needs root and util-linux's unshare (network and mount namespaces)")
        return 1
    env = {**os.environ, INSIDE: "1"}
    here = [sys.executable, "-m", "bench.fresh_machine", *argv]
    return subprocess.run(["unshare", "-n", "-m", *here], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
