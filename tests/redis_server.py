"""A Redis server of one's own (Debian's ``redis-server``) on a free loopback port.

For what must not touch the machine's shared Redis: the chaos soak FLUSHALLs and restarts its
Redis, and two test runs may go on at once on one machine."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.e2e import live


class RedisServer:
    """``redis-server`` on ``port`` (a free one by default), keeping nothing on disk."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or live.free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until it answers PING (10 s at most)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian's redis-server package)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.workdir)]
        log = (self.workdir / f"redis-{self.port}.log").open("ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        limit = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > limit:
                        raise RuntimeError(f"redis-server on {self.port} did not start") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """SHUTDOWN NOSAVE: everything it held is lost, as in a crash of a server without
        persistence."""
        if self.process is None:
            return
        with contextlib.suppress(redis.ConnectionError):  # it went away as it shut down
            redis.Redis(port=self.port, socket_connect_timeout=1).shutdown(nosave=True)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None
