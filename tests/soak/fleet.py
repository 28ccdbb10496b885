"""The soak's fleet: real dueflow processes on this machine, started, killed, frozen and
restarted by the chaos driver.

A leg runs the payment simulator (``dueflow simulator``, its own process so that its records
survive every API restart), ``api`` API processes (``dueflow serve --no-worker``, each on its
own port, as behind a load balancer) and ``workers`` worker processes (``dueflow worker``), one
of them with its wall clock ``fast_clock`` seconds ahead through Debian's libfaketime. On SQLite
the leg is one ``dueflow serve`` with its worker inside, as SQLite is served. A leg with
``own_redis`` runs a ``redis-server`` of its own (no persistence) for its trigger, locks and seat
cache, so the chaos can restart it (never the shared one).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import redis

from tests.conftest import eventually_sync
from tests.e2e.live import DUEFLOW, answers, free_port

#: Where Debian's libfaketime lives (x86_64 or aarch64).
FAKETIME_LIBS = [
    Path(f"/usr/lib/{arch}-linux-gnu/faketime/libfaketime.so.1") for arch in ("x86_64", "aarch64")
]
TOKEN = re.compile(r"token:? (\S+)")


class FleetError(RuntimeError):
    """A process of the fleet would not start or answer."""


def faketime_lib() -> Path:
    """libfaketime's path; FleetError when it is not installed."""
    for lib in FAKETIME_LIBS:
        if lib.exists():
            return lib
    raise FleetError("libfaketime is not installed (apt-get install libfaketime)")


@dataclass
class Proc:
    """One process of the fleet: how to start it, and the running one."""

    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    ready: Callable[[Proc], bool] = lambda proc: True
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self, timeout: float = 60) -> None:
        """Start it and wait until it is ready."""
        self.spawn()
        self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start it; :meth:`wait_ready` waits for it to be ready."""
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts + 1} at {time.time():.3f}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=out)
        self.starts += 1

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until it is ready; FleetError if it ends or is not ready within ``timeout``."""
        if (
            not eventually_sync(lambda: self.ready(self) or not self.alive, timeout, 0.1)
            or not self.alive
        ):
            raise FleetError(f"{self.name} did not start:\n{self.tail()}")

    @property
    def alive(self) -> bool:
        """Running (a stopped process is running)."""
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int:
        """The running process's id."""
        assert self.popen is not None
        return self.popen.pid

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` if it runs."""
        if self.alive:
            assert self.popen is not None
            self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.popen is not None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.popen.wait(timeout=30)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (after SIGCONT, should it be frozen) and wait; SIGKILL after ``timeout``."""
        if self.popen is None:
            return None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.returncode

    def output(self) -> str:
        """Everything it printed, every start."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 40) -> str:
        """The last lines it printed."""
        return "\n".join(self.output().splitlines()[-lines:])


@dataclass(frozen=True)
class LegConfig:
    """What one leg of the soak runs on."""

    name: str
    title: str
    database_url: str
    #: ``db``, ``redis://...`` or ``amqp://...``
    trigger_url: str = "db"
    #: Redis for the locks and the seat cache ("" for none).
    redis_url: str = ""
    api: int = 2
    workers: int = 3
    #: Seconds the last worker's wall clock runs ahead (0: none).
    fast_clock: int = 30
    #: The durations and intervals, as dueflow settings (``DUEFLOW_`` names).
    settings: Mapping[str, str] = field(default_factory=dict)
    #: Run a ``redis-server`` of the leg's own (no persistence) in place of the host and port
    #: of ``trigger_url`` and ``redis_url``: the chaos may restart it.
    own_redis: bool = False

    @property
    def sqlite(self) -> bool:
        """One process on SQLite, its worker inside."""
        return self.database_url.startswith("sqlite")


def start_all(procs: list[Proc]) -> None:
    """Start every one of ``procs`` at once and wait until all are ready."""
    for proc in procs:
        proc.spawn()
    for proc in procs:
        proc.wait_ready()


def clean_env() -> dict[str, str]:
    """This process's environment without any DUEFLOW_ setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}


def _pings(port: int) -> bool:
    """A Redis on ``port`` answers PING."""
    client = redis.Redis(port=port, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _said(pattern: str) -> Callable[[Proc], bool]:
    """Ready once the process printed ``pattern`` in its current start."""
    rx = re.compile(pattern)

    def ready(proc: Proc) -> bool:
        return len(rx.findall(proc.output())) >= proc.starts

    return ready


class Fleet:
    """Every process of one leg, in ``workdir``."""

    def __init__(self, config: LegConfig, workdir: Path, notify_base: str) -> None:
        """``notify_base``: the soak's webhook receiver (``/notice`` and ``/events`` under it)."""
        self.config = config
        self.workdir = workdir
        self.notify_base = notify_base
        self.sim: Proc | None = None
        #: The proxy between the leg's processes and PostgreSQL, on ``pg_proxy_port``.
        self.pg_proxy: Proc | None = None
        self.pg_proxy_port = 0
        #: The leg's own ``redis-server`` (``own_redis``), on ``redis_port``.
        self.redis: Proc | None = None
        self.redis_port = 0
        self.apis: list[Proc] = []
        self.workers: list[Proc] = []
        self.ports: list[int] = []
        self.admin_token = ""
        self.sim_url = ""
        self._keys: dict[str, str] = {}

    @property
    def api_urls(self) -> list[str]:
        """The API processes' base URLs."""
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def env(self) -> dict[str, str]:
        """The settings every dueflow process of the leg runs with."""
        env = clean_env()
        env.update(
            {
                "DUEFLOW_DATABASE_URL": self.through_proxy(self.config.database_url),
                "DUEFLOW_TRIGGER_URL": self.on_own_redis(self.config.trigger_url),
                "DUEFLOW_NOTIFIER": "webhook",
                "DUEFLOW_NOTIFIER_URL": f"{self.notify_base}/notice",
                "DUEFLOW_EVENTS_WEBHOOK_URL": f"{self.notify_base}/events",
                "DUEFLOW_EVENTS_WEBHOOK_SECRET": "soak-events-secret",
                "DUEFLOW_PUBLIC_URL": self.api_urls[0],
                "DUEFLOW_SESSION_SECRET": "soak-session-secret-0123456789",
                **dict(self.config.settings),
            }
        )
        if self.config.redis_url:
            env["DUEFLOW_LOCKS_URL"] = self.on_own_redis(self.config.redis_url)
            env["DUEFLOW_SEAT_CACHE_URL"] = self.on_own_redis(self.config.redis_url)
        env.update(self._keys)
        return env

    def through_proxy(self, url: str) -> str:
        """``url`` by way of the leg's PostgreSQL proxy when it has one."""
        if self.pg_proxy is None:
            return url
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.pg_proxy_port}"))

    def start_pg_proxy(self) -> None:
        """The TCP proxy the leg's processes reach PostgreSQL through (``python -m
        tests.proxy``): the chaos cuts it to restart PostgreSQL as they see it."""
        parts = urlsplit(self.config.database_url)
        self.pg_proxy_port = free_port()
        upstream = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5432}"
        self.pg_proxy = Proc(
            "pg-proxy",
            [sys.executable, "-m", "tests.proxy", str(self.pg_proxy_port), upstream],
            clean_env(),
            self.workdir / "pg-proxy.log",
            ready=_said(r"proxy on "),
        )
        self.pg_proxy.start()

    def on_own_redis(self, url: str) -> str:
        """``url`` pointed at the leg's own ``redis-server`` when it has one (a ``redis://``
        URL only)."""
        if not (self.config.own_redis and url.startswith("redis")):
            return url
        return urlunsplit(urlsplit(url)._replace(netloc=f"127.0.0.1:{self.redis_port}"))

    def start_redis(self) -> None:
        """The leg's own ``redis-server``: nothing on disk, so a restart loses every key."""
        self.redis_port = free_port()
        self.redis = Proc(
            "redis",
            [
                *("redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no"),
            ],
            clean_env(),
            self.workdir / "redis.log",
            ready=lambda proc: _pings(self.redis_port),
        )
        self.redis.start()

    def start(self) -> None:
        """The leg's own Redis, the simulator, the schema and an admin, the API processes, the
        workers."""
        if self.config.own_redis:
            self.start_redis()
        if self.config.database_url.startswith("postgresql"):
            self.start_pg_proxy()
        sim_port = free_port()
        self.sim_url = f"http://127.0.0.1:{sim_port}"
        self.sim = Proc(
            "simulator",
            [str(DUEFLOW), "simulator", "--port", str(sim_port), "--time-scale", "60"],
            clean_env(),
            self.workdir / "simulator.log",
            ready=lambda proc: answers(f"{self.sim_url}/control/keys"),
        )
        self.sim.start()
        keys = httpx.get(f"{self.sim_url}/control/keys", timeout=10).json()
        self._keys = {f"DUEFLOW_{name.upper()}": str(value) for name, value in keys.items()}
        self.ports = [free_port() for _ in range(1 if self.config.sqlite else self.config.api)]
        self._cli("migrate")
        made = self._cli("users", "add", "soak-admin", "--admin")
        found = TOKEN.search(made)
        if found is None:
            raise FleetError(f"no admin token in: {made}")
        self.admin_token = found[1]
        for i, port in enumerate(self.ports):
            args = [str(DUEFLOW), "serve", "--port", str(port)]
            if not self.config.sqlite:
                args.append("--no-worker")
            url = f"http://127.0.0.1:{port}/healthz"
            self.apis.append(
                Proc(
                    f"api-{i + 1}",
                    args,
                    self.env(),
                    self.workdir / f"api-{i + 1}.log",
                    ready=lambda proc, url=url: answers(url),
                )
            )
        start_all(self.apis)
        if self.config.sqlite:
            return
        for i in range(self.config.workers):
            env = self.env()
            name = f"worker-{i + 1}"
            if self.config.fast_clock and i == self.config.workers - 1:
                env.update(
                    {
                        "LD_PRELOAD": str(faketime_lib()),
                        "FAKETIME": f"+{self.config.fast_clock}s",
                        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                        "FAKETIME_DONT_RESET": "1",
                    }
                )
                name += f"-clock+{self.config.fast_clock}s"
            self.workers.append(
                Proc(
                    name,
                    [str(DUEFLOW), "worker"],
                    env,
                    self.workdir / f"{name}.log",
                    ready=_said(r"worker \S+ running"),
                )
            )
        start_all(self.workers)

    def _cli(self, *args: str) -> str:
        """Run one ``dueflow`` command with the leg's settings; what it printed."""
        done = subprocess.run(
            [str(DUEFLOW), *args], env=self.env(), capture_output=True, timeout=120, check=False
        )
        out = (done.stdout + done.stderr).decode(errors="replace")
        if done.returncode != 0:
            raise FleetError(f"dueflow {' '.join(args)} failed ({done.returncode}):\n{out}")
        return out

    def status(self) -> str:
        """``dueflow status`` of the leg's database."""
        return self._cli("status")

    def processes(self) -> list[Proc]:
        """Every dueflow process but the simulator."""
        return [*self.apis, *self.workers]

    def cpu_seconds(self) -> float:
        """User and system CPU the running dueflow processes and the simulator have used (a
        process restarted since counts from its restart)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for proc in [*self.processes(), *([self.sim] if self.sim else [])]:
            if not proc.alive:
                continue
            try:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return total

    def heal(self) -> None:
        """Resume what is frozen and start what is dead (the end of the chaos)."""
        if self.redis is not None and not self.redis.alive:
            self.redis.start()
        if self.pg_proxy is not None:
            self.pg_proxy.signal(signal.SIGUSR2)  # listening again, if a restart was cut short
        for proc in self.processes():
            proc.signal(signal.SIGCONT)
            if not proc.alive:
                proc.start()

    def stop(self) -> dict[str, int | None]:
        """Stop every process (workers first, the simulator last); their exit codes."""
        codes = {proc.name: proc.stop() for proc in [*self.workers, *self.apis]}
        if self.sim is not None:
            codes[self.sim.name] = self.sim.stop()
        if self.redis is not None:
            codes[self.redis.name] = self.redis.stop()
        if self.pg_proxy is not None:
            codes[self.pg_proxy.name] = self.pg_proxy.stop()
        return codes
