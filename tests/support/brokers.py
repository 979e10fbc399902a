"""The real brokers the integration tests run against, and a check that they answer."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "BACKEND_URL",
    "BROKERS",
    "REDIS_URL",
    "PrivateRedis",
    "Restartable",
    "SharedRabbitMQ",
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
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
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


class SharedRabbitMQ:
    """The shared RabbitMQ's application, stopped and started (durable queues and persistent
    messages survive); only for runs that own the machine, as CI does."""

    url = BROKERS["rabbitmq"]

    def __init__(self) -> None:
        self.stopped = False

    @staticmethod
    def _ctl(*command: str) -> None:
        subprocess.run(["rabbitmqctl", *command], check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        self.stopped = True
        self._ctl("stop_app")

    def start(self) -> None:
        self._ctl("start_app")
        self._ctl("await_startup")
        self.stopped = False

    def restart(self, down_for: float = 1.0) -> None:
        self.stop()
        time.sleep(down_for)  # the outage itself, not a wait for a condition
        self.start()

    def lost_in_transit(self) -> Counter[str]:
        """None: a RabbitMQ message is the broker's until it is acked."""
        return Counter()


Restartable = PrivateRedis | SharedRabbitMQ


@contextmanager
def restartable_broker(kind: str, workdir: Path) -> Iterator[Restartable]:
    """A broker a test may stop, start and restart: a private persistent Redis, or the shared
    RabbitMQ, which is running again afterwards whatever the test did."""
    if kind == "rabbitmq":
        require_broker("rabbitmq")
        rabbitmq = SharedRabbitMQ()
        try:
            yield rabbitmq
        finally:
            if rabbitmq.stopped:
                rabbitmq.start()
        return
    server = PrivateRedis(workdir).start()
    try:
        yield server
    finally:
        server.stop()
