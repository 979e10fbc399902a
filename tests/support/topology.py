"""Private Redis topologies on loopback for the store tests: a 3-master Redis Cluster, and a
master with a replica watched by 3 Sentinels.

Everything runs from the Debian ``redis-server`` binary (``redis-server --sentinel`` for the
Sentinels), on high ports (7100 and up, a free block found by probing, never 6379), in a
private directory, and is stopped by :meth:`stop` (SIGTERM, then SIGKILL), which the fixtures
call in their finalizers whatever the test did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

__all__ = ["RedisClusterTopology", "SentinelTopology", "redis_cluster", "redis_sentinel"]

#: The lowest port the topologies use; blocks of 20 ports are probed upward from it (each
#: pytest-xdist process from its own 1,000, so that two never probe the same block at once).
BASE_PORT = 7100 + 1000 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_BLOCK = 20
_BUS_OFFSET = 10000  # Redis Cluster's bus port is the client port + 10000


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_block(count: int, cluster_bus: bool = False) -> int:
    """The first port of *count* consecutive free ports at or above :data:`BASE_PORT`."""
    for base in range(BASE_PORT, BASE_PORT + 50 * _BLOCK, _BLOCK):
        ports = range(base, base + count)
        if all(_free(p) for p in ports) and (
            not cluster_bus or all(_free(p + _BUS_OFFSET) for p in ports)
        ):
            return base
    raise RuntimeError(f"no {count} free ports from {BASE_PORT} up")


def _wait(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class _Processes:
    """The servers of one topology, by port; each in its own session."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, port: int, *args: str, sentinel: bool = False) -> None:
        d = self.workdir / str(port)
        d.mkdir(parents=True, exist_ok=True)
        if sentinel:
            conf = d / "sentinel.conf"
            conf.write_text("\n".join(args) + "\n")
            argv = ["redis-server", str(conf), "--sentinel", "--port", str(port)]
        else:
            argv = ["redis-server", "--port", str(port), *args]
        argv += ["--bind", "127.0.0.1", "--dir", str(d), "--logfile", str(d / "log")]
        self.procs[port] = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        _wait(lambda: redis.Redis(port=port, socket_timeout=1).ping(), f"redis on {port}")

    def kill(self, port: int) -> None:
        """SIGKILL the server on *port* (a crash: nothing flushed, no goodbye)."""
        proc = self.procs.get(port)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def pause(self, port: int) -> None:
        """SIGSTOP the server on *port*: its connections stay open, it answers nothing."""
        self.procs[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        proc = self.procs.get(port)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for port, proc in self.procs.items():
            if proc.poll() is None:
                self.resume(port)  # a paused server cannot act on SIGTERM
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


class RedisClusterTopology:
    """Three masters, no replicas, every slot covered; ``url`` is the store URL for it."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        self.base = _free_block(masters, cluster_bus=True)
        self.ports = [self.base + i for i in range(masters)]
        self.servers = _Processes(workdir)
        self.url = f"redis+cluster://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> RedisClusterTopology:
        for port in self.ports:
            self.servers.start(
                port, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
            )  # fmt: skip
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        _wait(self._ok, "the cluster to cover every slot")
        return self

    def _ok(self) -> bool:
        for port in self.ports:
            info = redis.Redis(port=port, socket_timeout=1, decode_responses=True).cluster("info")
            if info.get("cluster_state") != "ok":
                return False
        return True

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0], decode_responses=True)

    def stop(self) -> None:
        self.servers.stop()


class SentinelTopology:
    """A master, one replica and three Sentinels with short failover timings.

    ``url`` is the store URL (``sentinel://...;sentinel://...``) and :attr:`master_name`
    goes in ``extras_redis_options``. :meth:`kill_master` SIGKILLs whichever server is
    the master now, and :meth:`wait_failover` waits for the Sentinels to promote another.
    """

    master_name = "extras-test"
    down_after_ms = 1000
    failover_timeout_ms = 3000

    def __init__(self, workdir: Path) -> None:
        self.base = _free_block(5)
        self.data_ports = [self.base, self.base + 1]
        self.sentinel_ports = [self.base + 2, self.base + 3, self.base + 4]
        self.servers = _Processes(workdir)
        self.url = ";".join(f"sentinel://127.0.0.1:{p}" for p in self.sentinel_ports) + "/0"
        self.options = {"master_name": self.master_name}

    def start(self) -> SentinelTopology:
        master, replica = self.data_ports
        common = ("--save", "", "--appendonly", "no", "--repl-diskless-sync", "yes",
                  "--repl-diskless-sync-delay", "0")  # fmt: skip
        self.servers.start(master, *common)
        self.servers.start(replica, *common, "--replicaof", "127.0.0.1", str(master))
        _wait(self._replica_synced, "the replica to sync")
        for port in self.sentinel_ports:
            self.servers.start(
                port,
                f"sentinel monitor {self.master_name} 127.0.0.1 {master} 2",
                f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}",
                f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {self.master_name} 1",
                sentinel=True,
            )
        _wait(self._sentinels_agree, "the Sentinels to see each other and the replica")
        return self

    def _replica_synced(self) -> bool:
        info = redis.Redis(port=self.data_ports[1], socket_timeout=1).info("replication")
        return bool(info.get("master_link_status") == "up")

    def _sentinels_agree(self) -> bool:
        for port in self.sentinel_ports:
            s = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
            state = s.sentinel_master(self.master_name)
            if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                return False
        return True

    def master_port(self) -> int:
        s = redis.Redis(port=self.sentinel_ports[0], socket_timeout=1, decode_responses=True)
        _host, port = s.sentinel_get_master_addr_by_name(self.master_name)
        return int(port)

    def replica_port(self) -> int:
        """The data server that is not the master now."""
        master = self.master_port()
        return next(p for p in self.data_ports if p != master)

    def pause(self, port: int) -> None:
        """SIGSTOP the server on *port* (a replica that stops acknowledging, link still up)."""
        self.servers.pause(port)

    def resume(self, port: int) -> None:
        self.servers.resume(port)

    def kill_master(self) -> int:
        """SIGKILL the current master; returns its port."""
        port = self.master_port()
        self.servers.kill(port)
        return port

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> float:
        """Wait until every Sentinel names a master other than *old_port*; seconds waited."""
        start = time.monotonic()

        def promoted() -> bool:
            for port in self.sentinel_ports:
                s = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
                addr = s.sentinel_get_master_addr_by_name(self.master_name)
                if addr is None or int(addr[1]) == old_port:
                    return False
            new = redis.Redis(port=self.master_port(), socket_timeout=1)
            return bool(new.info("replication")["role"] == "master")

        _wait(promoted, "the Sentinels to promote the replica", timeout)
        return time.monotonic() - start

    def stop(self) -> None:
        self.servers.stop()


@contextlib.contextmanager
def redis_cluster(workdir: Path) -> Iterator[RedisClusterTopology]:
    topology = RedisClusterTopology(workdir)
    try:
        yield topology.start()
    finally:
        topology.stop()


@contextlib.contextmanager
def redis_sentinel(workdir: Path) -> Iterator[SentinelTopology]:
    topology = SentinelTopology(workdir)
    try:
        yield topology.start()
    finally:
        topology.stop()
