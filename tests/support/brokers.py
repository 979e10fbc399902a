"""The real brokers the integration tests run against, and a check that they answer."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "BACKEND_URL",
    "BROKERS",
    "REDIS_URL",
    "PrivateRabbitMQ",
    "PrivateRedis",
    "Restartable",
    "free_port",
    "private_rabbitmq",
    "require_broker",
    "restartable_broker",
]

REDIS_URL = "redis://127.0.0.1:6379/0"
BACKEND_URL = "redis://127.0.0.1:6379/1"
BROKERS = {
    "redis": REDIS_URL,
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//",
}
_PORTS = {"redis": 6379, "rabbitmq": 5672}


def require_broker(name: str) -> str:
    """The broker's URL; fails (never skips) when nothing listens on its port."""
    try:
        socket.create_connection(("127.0.0.1", _PORTS[name]), timeout=2).close()
    except OSError as exc:
        raise RuntimeError(
            f"{name} is not running on 127.0.0.1:{_PORTS[name]} ({exc}); start it as .ci/run does"
        ) from exc
    return BROKERS[name]


class PrivateRedis:
    """A ``redis-server`` of the test's own, persisted with an append-only file, so that a
    restart keeps its queues: for broker-restart tests that must not disturb the shared one.

    The file is synced to disk once a second (Redis' default, ``everysec``): :meth:`stop`
    (SIGTERM: Redis writes and syncs the file as it exits) loses nothing, and no reply
    waits for the disk. With ``always`` (a sync before each reply) a disk stall
    of the machine (a second, with the scenario tests' workers writing beside) stalled the
    server, and a store call past ``extras_store_timeout`` made a second outage of one."""

    def __init__(self, workdir: Path, *args: str) -> None:
        """*args*: more ``redis-server`` options (``"--maxmemory", "3mb"``)."""
        self.args = args
        self.port = free_port()
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(self.workdir),
             *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    message = f"private redis-server on {self.port} did not start"
                    raise RuntimeError(message) from None
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM (Redis flushes its append-only file and exits), SIGKILL if it hangs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def restart(self, down_for: float = 1.0) -> None:
        self.stop()
        time.sleep(down_for)  # the outage itself, not a wait for a condition
        self.start()

    def lost_in_transit(self) -> Counter[str]:
        """Task ids of messages kombu's Redis transport lost on their way to a worker.

        The transport pops a message with ``BRPOP`` and books it as unacked (``HSET`` by
        delivery tag) only once the reply reaches the worker, before Celery sees it: a pop
        answered as the server stops is never booked and never reaches the worker (kombu
        issue 305; plain Celery alike). Read from the append-only file, which logs every
        push, pop and booking: a pop of a delivery tag not followed by its booking.
        """
        queues: dict[bytes, list[tuple[str, str]]] = {}
        popped: dict[str, str] = {}  # delivery tag -> task id, popped and not booked yet
        lost: Counter[str] = Counter()
        for command in _aof_commands(self.workdir / "appendonlydir"):
            verb, key, values = command[0].upper(), command[1:2], command[2:]
            if verb in (b"LPUSH", b"RPUSH") and key:
                for raw in values:
                    message = _task_message(raw)
                    if message is None:
                        continue
                    queue = queues.setdefault(key[0], [])
                    if verb == b"LPUSH":
                        queue.insert(0, message)
                    else:
                        queue.append(message)
            elif verb in (b"RPOP", b"LPOP") and key and queues.get(key[0]):
                tag, task_id = queues[key[0]].pop() if verb == b"RPOP" else queues[key[0]].pop(0)
                if tag in popped:  # popped before and never booked: that delivery was lost
                    lost[popped.pop(tag)] += 1
                popped[tag] = task_id
            elif verb == b"HSET" and key and key[0].endswith(b"unacked") and values:
                popped.pop(values[0].decode(), None)
        for task_id in popped.values():
            lost[task_id] += 1
        return lost


def _aof_commands(aof_dir: Path) -> Iterator[list[bytes]]:
    """The commands of a Redis 7 multi-part append-only file's incremental parts, in order."""
    parts = sorted(aof_dir.glob("*.incr.aof"), key=lambda f: int(f.name.split(".")[-3]))
    for part in parts:
        data, i = part.read_bytes(), 0
        while i < len(data):
            if data[i : i + 1] != b"*":  # not an array: skip the line
                i = data.index(b"\n", i) + 1
                continue
            end = data.index(b"\r\n", i)
            count, i, command = int(data[i + 1 : end]), end + 2, []
            for _ in range(count):
                end = data.index(b"\r\n", i)
                length = int(data[i + 1 : end])
                command.append(data[end + 2 : end + 2 + length])
                i = end + 2 + length + 2
            yield command


def _task_message(raw: bytes) -> tuple[str, str] | None:
    """``(delivery tag, task id)`` of a kombu Redis message, ``None`` for anything else."""
    try:
        message = json.loads(raw)
        return message["properties"]["delivery_tag"], message["headers"]["id"]
    except (ValueError, KeyError, TypeError):
        return None


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateRabbitMQ:
    """A RabbitMQ node of the test's own (its own port, Erlang distribution port, data and
    log folders), started with ``rabbitmq-server -detached``: a test may stop and restart
    it beside tests that use the shared one. Durable queues and persistent messages
    survive :meth:`restart` (the application stopped and started, as on the shared node).

    Its folder is not the test's ``tmp_path``: Debian's ``rabbitmq-server`` runs the node as
    the ``rabbitmq`` user, who cannot enter pytest's folders (mode 700)."""

    STARTUP = 120.0  # seconds: a node boots in about 5 s alone, far slower on a loaded machine

    def __init__(self) -> None:
        self.port = free_port()
        self.node = f"test{self.port}@localhost"
        self.dist_port = free_port()  # Erlang's distribution port
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.home: Path | None = None
        self.stopped = True

    def _env(self) -> dict[str, str]:
        assert self.home is not None
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.home / "log"),
            "RABBITMQ_PID_FILE": str(self.home / "pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.home / "plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.home / "rabbitmq.conf"),
        }

    def ctl(self, *command: str) -> str:
        """``rabbitmqctl -q`` *command* on this node; its output."""
        done = subprocess.run(["rabbitmqctl", "-q", "-n", self.node, *command], check=True,
                              capture_output=True, text=True, timeout=self.STARTUP)  # fmt: skip
        return done.stdout

    def launch(self) -> PrivateRabbitMQ:
        """Boot the node (its Erlang VM and the application), once."""
        self.home = Path(tempfile.mkdtemp(prefix=f"rabbitmq-{self.port}-"))
        (self.home / "plugins").write_text("[].\n")
        (self.home / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        if os.geteuid() == 0:  # the server script runs the node as the rabbitmq user
            for path in (self.home, *self.home.iterdir()):
                shutil.chown(path, "rabbitmq", "rabbitmq")
        subprocess.run(["rabbitmq-server", "-detached"], env=self._env(), check=True,
                       capture_output=True, timeout=self.STARTUP)  # fmt: skip
        deadline = time.monotonic() + self.STARTUP
        while True:  # await_startup fails at once while the VM is not yet registered
            try:
                self.ctl("await_startup")
                break
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"private RabbitMQ {self.node} did not start "
                                       f"(logs: {self.home / 'log'})") from None  # fmt: skip
                time.sleep(0.5)
        self.stopped = False
        return self

    def stop(self) -> None:
        """Stop the application (the node's VM keeps running, as on the shared node)."""
        self.stopped = True
        self.ctl("stop_app")

    def start(self) -> None:
        self.ctl("start_app")
        self.ctl("await_startup")
        self.stopped = False

    def restart(self, down_for: float = 1.0) -> None:
        self.stop()
        time.sleep(down_for)  # the outage itself, not a wait for a condition
        self.start()

    def shutdown(self) -> None:
        """Stop the whole node and remove its folder."""
        if self.home is None:
            return
        try:  # with the pid file, rabbitmqctl waits until the VM has exited
            self.ctl("stop", str(self.home / "pid"))
        except (subprocess.SubprocessError, OSError):
            pid = (self.home / "pid").read_text().strip() if (self.home / "pid").exists() else ""
            if pid.isdigit():
                subprocess.run(["kill", "-9", pid], check=False)
        shutil.rmtree(self.home, ignore_errors=True)
        self.home = None

    def lost_in_transit(self) -> Counter[str]:
        """None: a RabbitMQ message is the broker's until it is acked."""
        return Counter()


Restartable = PrivateRedis | PrivateRabbitMQ


@contextmanager
def private_rabbitmq() -> Iterator[PrivateRabbitMQ]:
    """A RabbitMQ node of the caller's own, shut down afterwards whatever happened."""
    rabbitmq = PrivateRabbitMQ()
    try:
        yield rabbitmq.launch()
    finally:
        rabbitmq.shutdown()


@contextmanager
def restartable_broker(kind: str, workdir: Path) -> Iterator[Restartable]:
    """A broker of the test's own that it may stop, start and restart: a persistent Redis,
    or a RabbitMQ node; stopped afterwards whatever the test did."""
    if kind == "rabbitmq":
        with private_rabbitmq() as rabbitmq:
            yield rabbitmq
        return
    server = PrivateRedis(workdir).start()
    try:
        yield server
    finally:
        server.stop()
