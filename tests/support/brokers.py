"""The real brokers the integration tests run against, and a check that they answer."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

__all__ = [
    "BACKEND_URL",
    "BROKERS",
    "REDIS_URL",
    "PrivateRedis",
    "Restartable",
    "SharedRabbitMQ",
    "lost_in_transit",
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
    restart keeps its queues: for broker-restart tests that must not disturb the shared one."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir)],
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


def lost_in_transit(broker_url: str, missing: Iterable[str], worker_logs: str) -> set[str]:
    """Of the *missing* task ids, those kombu's Redis transport lost on its way to a worker.

    The transport pops a message with ``BRPOP`` before the worker has it and books it as
    unacked only once the reply arrives: a pop answered as the server stops never reaches
    the worker, and the message is gone (kombu issue 305; plain Celery alike). Such an id
    was never logged as received by a worker and is in no list or hash of the broker any
    more. RabbitMQ has no such window: there, nothing counts as lost in transit.
    """
    if not broker_url.startswith("redis"):
        return set()
    candidates = {i for i in missing if f"[{i}] received" not in worker_logs}
    if not candidates:
        return set()
    client = redis.Redis.from_url(broker_url)
    try:
        held = []
        for key in client.scan_iter(count=1000):
            kind = client.type(key)
            if kind == b"list":
                held.extend(client.lrange(key, 0, -1))
            elif kind == b"hash":
                held.extend(client.hvals(key))
    finally:
        client.close()
    everything = b"\n".join(v for v in held if isinstance(v, bytes))
    return {i for i in candidates if i.encode() not in everything}
