"""A real local Redis Cluster: 3 masters and 3 replicas (``redis-server --cluster-enabled yes``
on free ports, in a temporary directory), made by ``redis-cli --cluster create``.

The contract tests' fixture starts one per session; a benchmark can have one too:

    .venv/bin/python -m tests.redis_cluster      # prints the URL, runs until Ctrl-C or SIGTERM
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.crc import key_slot

#: How long a master may be silent before its replica takes over (the failover test forces the
#: takeover sooner); short so a test never waits long.
NODE_TIMEOUT_MS = 1000


@dataclass
class LocalCluster:
    """The nodes of a cluster started here: port -> process."""

    root: Path
    nodes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ports(self) -> list[int]:
        return sorted(self.nodes)

    @property
    def url(self) -> str:
        """The dueflow URL: every node a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + "/"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)

    def role(self, port: int) -> str:
        """``master`` or ``slave`` (as Redis says it); ``down`` when the node does not answer."""
        try:
            with self.client(port) as node:
                return str(node.info("replication")["role"])
        except (redis.RedisError, OSError):
            return "down"

    def masters(self) -> list[int]:
        return [p for p in self.ports if self.role(p) == "master"]

    def replica_of(self, master: int) -> int:
        """The port of a replica of ``master``."""
        with self.client(master) as node:
            info = node.info("replication")
        return int(info["slave0"]["port"])

    def replicated(self, replicas: int) -> bool:
        """Every master has ``replicas`` replicas online."""
        for port in self.masters():
            with self.client(port) as node:
                info = node.info("replication")
            online = [k for k in info if k.startswith("slave") and k[5:].isdigit()]
            if sum(info[k]["state"] == "online" for k in online) < replicas:
                return False
        return True

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot, as a live node sees it."""
        slot = key_slot(key.encode())
        for port in self.ports:
            if self.role(port) == "down":
                continue
            with self.client(port) as node:
                for start, end, master, *_ in node.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        return int(master[1])
        raise RuntimeError(f"no live node serves slot {slot}")

    def kill(self, port: int) -> None:
        """SIGKILL the node: no goodbye to the cluster, no save."""
        process = self.nodes[port]
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def start(self, port: int) -> None:
        """(Re)start the node on its port with its own directory and nodes.conf."""
        folder = self.root / str(port)
        folder.mkdir(exist_ok=True)
        self.nodes[port] = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(NODE_TIMEOUT_MS),
                "--dir",
                str(folder),
                "--save",
                "",
                "--appendonly",
                "no",
                "--repl-diskless-sync-delay",  # a replica's first sync at once, not after 5 s
                "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _until(lambda: self.role(port) != "down", f"node {port} did not start")

    def ok(self) -> bool:
        """Every node up and the cluster's state ok, as each node sees it."""
        for port in self.ports:
            try:
                with self.client(port) as node:
                    if node.cluster("info")["cluster_state"] != "ok":
                        return False
            except (redis.RedisError, OSError):
                return False
        return True

    def stop(self) -> None:
        for process in self.nodes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.nodes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def available() -> bool:
    """redis-server and redis-cli are installed."""
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def free_ports(count: int) -> list[int]:
    """``count`` free ports whose cluster bus ports (+10000) are free too."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


@contextlib.contextmanager
def running(masters: int = 3, replicas: int = 1) -> Iterator[LocalCluster]:
    """A cluster of ``masters`` masters with ``replicas`` replicas each, torn down at the end."""
    with tempfile.TemporaryDirectory(prefix="dueflow-cluster-") as root:
        cluster = LocalCluster(Path(root))
        try:
            for port in free_ports(masters * (1 + replicas)):
                cluster.start(port)
            subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{p}" for p in cluster.ports),
                    "--cluster-replicas",
                    str(replicas),
                    "--cluster-yes",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=60,
            )
            _until(cluster.ok, "the cluster did not reach state ok", 30)
            _until(lambda: cluster.replicated(replicas), "the replicas did not attach", 30)
            yield cluster
        finally:
            cluster.stop()


def _until(predicate: object, message: str, seconds: float = 10) -> None:
    limit = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > limit:
            raise RuntimeError(message)
        time.sleep(0.05)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    # A background job ignores SIGINT: SIGTERM tears the nodes down too.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with running() as started:
        print(started.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
